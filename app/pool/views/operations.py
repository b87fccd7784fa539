"""What the pool's and the requests' operations return (the engine's
bodies build them; one call, or one result of ``/batch``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from app.pool.views.base import Hashes, Ids, Out, PerGroupIds


class Allocated(Out):
    """The new blocks (queue head first) and the cached ones evicted to get them."""

    block_ids: Ids
    evicted: Ids = Field(description="cached blocks whose hash was dropped")


class Freed(Out):
    """The blocks whose ref count reached 0 (appended to the queue's tail)."""

    freed: Ids
    now_free: Ids


class Touched(Out):
    """Each block's ref count after the touch."""

    block_ids: Ids
    ref_cnts: Ids


class Cached(Out):
    """The blocks now cached and their hashes (hex digests)."""

    block_ids: Ids
    block_hashes: Hashes


class Evicted(Out):
    """Blocks whose hash was dropped, and those that held none."""

    evicted: Ids
    not_cached: Ids


class Reset(Out):
    """The prefix cache was cleared."""

    reset: bool


class Lookup(Out):
    """A hit in every group (block ids per group) or a miss."""

    hit: bool
    group_ids: Ids
    block_ids: Ids | None = Field(description="one block per group on a hit, null on a miss")


class PrefixLookup(Out):
    """How much of the prompt would hit the cache now."""

    num_tokens: int
    num_hit_tokens: int
    num_hit_blocks: int


class Admitted(Out):
    """The request's blocks per group, its prefix hit and what was computed."""

    request_id: str
    block_ids: PerGroupIds
    num_tokens: int
    num_hit_blocks: int
    num_computed_tokens: int
    num_new_blocks: int


class Appended(Out):
    """The blocks the new tokens needed (per group) and the new length."""

    request_id: str
    new_block_ids: PerGroupIds
    num_tokens: int


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
