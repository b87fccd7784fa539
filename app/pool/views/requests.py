"""What the request and demo routes show: the running requests, one
request's blocks, its K/V check, the demo workload."""

from __future__ import annotations

from collections import Counter
from itertools import islice
from typing import TYPE_CHECKING, Annotated, Any, NotRequired

from pydantic import Field, with_config
from typing_extensions import TypedDict

from app.pool.views.base import ITEM, Ids, Out, PerGroupIds
from app.shared.errors import Conflict, NotFound

if TYPE_CHECKING:
    from app.pool.engine import Engine


@with_config(ITEM)
class RequestItem(TypedDict):
    """A running request.  On a mirror (the engine's running requests) the
    tokens it made since and the blocks it holds are not told: null."""

    request_id: str
    num_tokens: int | None
    num_blocks: int | None
    num_hit_blocks: int | None
    num_prompt_tokens: NotRequired[
        Annotated[int | None, Field(None, description="on a mirror: its prompt's length")]
    ]


class Requests(Out):
    """A page of the running requests (on a mirror the engine's)."""

    total: int | None = Field(description="null: not known (a mirror that joined a busy engine)")
    offset: int
    limit: int
    items: list[RequestItem]
    reason: str | None = Field(None, description="why figures are null (a mirror's)")


@with_config(ITEM)
class RequestBlock(TypedDict):
    index: int
    block_ids: Ids
    tokens: int
    hit: bool
    block_hash: str | None
    reason: NotRequired[Annotated[str | None, Field(None)]]
    miss: NotRequired[dict[str, Any] | None]


class RequestInfo(Out):
    """One running request: its blocks, which were hits, their hashes."""

    request_id: str
    num_tokens: int
    num_prompt_tokens: int
    block_ids: PerGroupIds
    num_hit_blocks: int
    num_cached_blocks: int
    lora_name: str | None
    cache_salt: str | None
    blocks: list[RequestBlock]
    misses: dict[str, int] | None = None


class VerifyGroup(Out):
    ok: bool
    num_tokens: int
    bad_block_ids: Ids
    first_bad_token: int | None
    first_bad_slot: int | None


class Verified(Out):
    """Whether the request's blocks hold the K/V its tokens make."""

    ok: bool
    groups: list[VerifyGroup]
    request_id: str


class DemoStatus(Out):
    """The demo workload: running, rate, mix, decode lengths, its counters."""

    running: bool
    rate: float
    mix: dict[str, int]
    decode_tokens: Ids
    max_running: int
    max_waiting: int | None = Field(
        default=None, description="arrivals held waiting; past it the oldest are dropped"
    )
    requests_running: int
    requests_waiting: int
    stats: dict[str, int]


def request(engine: Engine, rid: str) -> RequestInfo:
    managed = engine.manager.requests.get(rid)
    if managed is None:
        raise NotFound(f"no running request {rid!r}", request_id=rid)
    req = managed.request
    bs = engine.manager.block_size
    reasons = engine.analysis.block_reasons(rid) if engine.analysis else []
    blocks: list[RequestBlock] = [
        {
            "index": i,
            "block_ids": [table[i].block_id for table in managed.block_tables],
            "tokens": min(bs, req.num_tokens - i * bs),
            "hit": i < managed.num_hit_blocks,
            "block_hash": managed.block_hashes[i].hex() if i < len(managed.block_hashes) else None,
            # why a prompt block missed (None: a hit, or a decode block)
            "reason": reasons[i][0] if i < len(reasons) else None,
            "miss": reasons[i][1] if i < len(reasons) else None,
        }
        for i in range(len(managed.block_tables[0]))
    ]
    return RequestInfo.model_construct(
        request_id=rid,
        num_tokens=req.num_tokens,
        num_prompt_tokens=req.num_prompt_tokens,
        block_ids=managed.block_ids(),
        num_hit_blocks=managed.num_hit_blocks,
        num_cached_blocks=managed.num_cached_blocks,
        lora_name=req.lora_request.lora_name if req.lora_request else None,
        cache_salt=req.cache_salt,
        blocks=blocks,
        misses=dict(Counter(r for r, _ in reasons if r is not None)),
    )


def verify(engine: Engine, rid: str) -> Verified:
    if engine.storage is None:
        raise Conflict("verify: the server runs without K/V storage (--no-storage)")
    managed = engine.manager.requests.get(rid)
    if managed is None:
        raise NotFound(f"no running request {rid!r}", request_id=rid)
    return Verified(**engine.storage.verify(managed), request_id=rid)


def requests(engine: Engine, offset: int, limit: int) -> Requests:
    if engine.request_listing is not None:  # a mirror's: the engine's running requests
        return Requests.model_construct(**engine.request_listing(offset, limit))
    reqs = engine.manager.requests
    items: list[RequestItem] = [
        {
            "request_id": rid,
            "num_tokens": m.num_tokens,
            "num_blocks": len(m.block_tables[0]),
            "num_hit_blocks": m.num_hit_blocks,
        }
        for rid, m in islice(reqs.items(), offset, offset + limit)
    ]
    return Requests.model_construct(total=len(reqs), offset=offset, limit=limit, items=items)
