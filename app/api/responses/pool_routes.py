"""What the pool routes return: configuration, summary, vLLM's operations."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from app.api.responses import Hashes, Ids, Out


class Limits(Out):
    max_body_bytes: int
    max_ids_per_call: int
    max_tokens_per_request: int
    max_batch_ops: int
    max_requests: int


class StorageBytes(Out):
    live_bytes: int
    cached_bytes: int
    empty_bytes: int
    other_bytes: int
    total_bytes: int


class StorageFacts(Out):
    device: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    num_blocks: int
    bytes_per_block: int
    bytes_allocated: int
    bytes: StorageBytes
    sized_by: str
    tokens_written: int
    verifications: int
    verify_failures: int


class Config(Out):
    """The pool's and the server's configuration."""

    num_blocks: int
    block_size: int
    hash_block_size: int
    num_groups: int
    hash_fn: str
    enable_caching: bool
    enable_events: bool
    metrics_sample_rate: float
    strict: bool
    model_name: str
    tick_hz: float
    auth_required_for_writes: bool
    auth_required_for_reads: bool
    limits: Limits
    storage: StorageFacts | None = Field(description="null when K/V storage is off")


class BlockCounts(Out):
    null: int
    in_use: int
    cached: int
    empty: int


class PrefixCache(Out):
    requests: int
    queries_tokens: int
    hits_tokens: int
    hit_rate: float | None = None


class Tokens(Out):
    """Token usage beside block usage.  On a mirror (told blocks, never
    tokens) held, tail_waste, usage_ratio and fill_ratio are null and
    ``reason`` says why."""

    held: int | None
    slots_reserved: int
    tail_waste: int | None
    capacity: int
    usage_ratio: float | None
    fill_ratio: float | None
    reason: str | None = Field(None, description="why the null figures are not known")


class EventLogInfo(Out):
    last_seq: int
    first_seq: int
    dropped: int
    lost_before_tick: int


class Summary(Out):
    """The pool now: block states, usage, prefix-cache hit rate, counters."""

    num_blocks: int
    blocks: BlockCounts
    num_free_blocks: int
    usage: float
    hash_map_keys: int
    groups: Ids
    prefix_cache: PrefixCache
    running_requests: int | None = Field(
        description="requests holding blocks; on a mirror the engine's running queue "
        "(null: not known, requests_reason says why)"
    )
    waiting_requests: int | None = Field(
        None,
        description="requests queued, not running; on a mirror the engine's waiting queue "
        "(null: not known)",
    )
    requests_reason: str | None = Field(
        None, description="why running_requests / waiting_requests are null (null: known)"
    )
    tokens: Tokens
    counters: dict[str, Any] = Field(description="operations, blocks and requests since start")
    event_log: EventLogInfo
    uptime_s: float


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
