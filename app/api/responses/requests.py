"""What the request, batch and demo routes return."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from app.api.responses import Ids, Out, PerGroupIds


class Admitted(Out):
    """The request's blocks per group, its prefix hit and what was computed."""

    request_id: str
    block_ids: PerGroupIds
    num_tokens: int
    num_hit_blocks: int
    num_computed_tokens: int
    num_new_blocks: int


class RequestItem(Out):
    """A running request.  On a mirror (the engine's running requests) the
    tokens it made since and the blocks it holds are not told: null."""

    request_id: str
    num_tokens: int | None
    num_blocks: int | None
    num_hit_blocks: int | None
    num_prompt_tokens: int | None = Field(None, description="on a mirror: its prompt's length")


class Requests(Out):
    """A page of the running requests (on a mirror the engine's)."""

    total: int | None = Field(description="null: not known (a mirror that joined a busy engine)")
    offset: int
    limit: int
    items: list[RequestItem]
    reason: str | None = Field(None, description="why figures are null (a mirror's)")


class RequestBlock(Out):
    index: int
    block_ids: Ids
    tokens: int
    hit: bool
    block_hash: str | None
    reason: str | None = None


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


class Appended(Out):
    """The blocks the new tokens needed (per group) and the new length."""

    request_id: str
    new_block_ids: PerGroupIds
    num_tokens: int


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


class Finished(Out):
    """The request's blocks, freed in reverse order (per group)."""

    request_id: str
    freed_block_ids: PerGroupIds


class BatchResult(Out):
    ok: bool
    result: dict[str, Any] | None = Field(default=None, description="when ok")
    error: dict[str, Any] | None = Field(default=None, description="the error, when refused")
    skipped: bool | None = Field(default=None, description="after a refusal with on_error: stop")


class Batch(Out):
    """One result per operation, in order."""

    applied: int
    failed: int
    errors: bool
    results: list[BatchResult]


# ------------------------------------------------------------------- demo


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


# --------------------------------------------------------------- analysis
