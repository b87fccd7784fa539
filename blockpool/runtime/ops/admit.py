"""Admit a request: the record, its handler and its declaration."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.core.errors import NotEnoughBlocksError
from blockpool.runtime.errors import Conflict, NotEnoughBlocks
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState, check_tokens
from blockpool.runtime.ops.fields import ExtraKey, RequestId, TokenId


@shape
class Admitted(TypedDict):
    """The request's blocks per group, its prefix hit and what was computed."""

    request_id: str
    block_ids: list[list[int]]
    num_tokens: int
    num_hit_blocks: int
    num_computed_tokens: int
    num_new_blocks: int


class AdmitOp(OpRecord[Admitted], kw_only=True):
    """Admit a request: prefix hit, allocation, caching of its full blocks."""

    op: Literal["admit"] = "admit"
    request_id: RequestId | None = None
    token_ids: Annotated[
        list[TokenId], msgspec.Meta(min_length=1, examples=[[1, 2, 3, 4, 5, 6, 7, 8, 9]])
    ]
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


def admit(rt: RuntimeState, op: AdmitOp) -> Outcome[Admitted]:
    mgr = rt.manager
    check_tokens(rt, len(op.token_ids), "admit")
    rid = op.request_id or rt.new_request_id()
    if rid in mgr.requests:
        raise Conflict(f"admit: request {rid!r} is already running", request_id=rid)
    limit = rt.caps.max_requests
    if len(mgr.requests) >= limit:
        raise Conflict(
            f"admit: {len(mgr.requests)} requests are running, the limit is {limit}",
            limit=limit,
        )
    try:
        adm = mgr.admit(rid, op.token_ids, lora_name=op.lora_name, cache_salt=op.cache_salt)
    except NotEnoughBlocksError as exc:
        rt.counters.requests_refused += 1
        raise NotEnoughBlocks(
            f"admit: {exc}", requested=exc.requested, free=exc.free, request_id=rid
        ) from None
    bs = mgr.block_size
    rt.tail_waste += (len(adm.block_ids[0]) * bs - len(op.token_ids)) * len(adm.block_ids)
    c = rt.counters
    c.requests_admitted += 1
    c.blocks_touched += adm.num_hit_blocks * len(adm.block_ids)
    result: Admitted = {
        "request_id": rid,
        "block_ids": adm.block_ids,
        "num_tokens": len(op.token_ids),
        "num_hit_blocks": adm.num_hit_blocks,
        "num_computed_tokens": adm.num_computed_tokens,
        "num_new_blocks": adm.num_new_blocks,
    }
    change = Change(
        ChangeKind.ADMIT,
        sync=adm.block_ids,
        request_id=rid,
        op=op,
        admission=adm,
        managed=mgr.requests[rid],
        write_from=adm.num_computed_tokens,
        allocated=adm.num_new_blocks,
    )
    return result, change


SPEC = OpSpec(AdmitOp, admit, ChangeKind.ADMIT)
