"""The pool and the server: configuration, storage, health, the KV-event
publisher, token usage, the summary."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from app.pool.views.base import Ids, Out
from blockpool.analysis import views as analysis_views
from blockpool.runtime.summary import pool_summary

if TYPE_CHECKING:
    from app.pool.engine import Engine


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


class Storage(Out):
    """K/V storage facts; ``enabled: false`` with the ``reason`` when off."""

    enabled: bool
    reason: str | None = Field(default=None, description="why storage is off")
    device: str | None = None
    dtype: str | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_size: int | None = None
    block_size: int | None = None
    num_blocks: int | None = None
    bytes_per_block: int | None = None
    bytes_allocated: int | None = None
    bytes: StorageBytes | None = None
    sized_by: str | None = None
    tokens_written: int | None = None
    verifications: int | None = None
    verify_failures: int | None = None


class Health(Out):
    """The server is up."""

    status: str
    num_blocks: int


class KvEvents(Out):
    """The ZMQ KV-event publisher: endpoints, seqs, buffer, counters."""

    enabled: bool
    running: bool | None = None
    endpoint: str | None = None
    bound_endpoint: str | None = None
    next_seq: int | None = None
    last_seq: int | None = None
    batches_published: int | None = None
    batches_dropped: int | None = None
    events_dropped: int | None = None
    fleet_url: str | None = None  # --fleet-url: the observer's page, or null


def config(engine: Engine) -> Config:
    s = engine.settings
    pool = engine.pool
    facts = engine.storage_facts()
    return Config(
        num_blocks=pool.num_gpu_blocks,
        block_size=s.block_size,
        hash_block_size=pool.hash_block_size,
        num_groups=s.num_groups,
        hash_fn=s.hash_fn,
        enable_caching=pool.enable_caching,
        enable_events=pool.enable_kv_cache_events,
        metrics_sample_rate=engine.collector.sample_rate,
        strict=pool.strict,
        model_name=s.model_name,
        tick_hz=s.tick_hz,
        auth_required_for_writes=s.token is not None,
        auth_required_for_reads=s.token is not None and s.protect_reads,
        limits=Limits.model_validate(s, from_attributes=True),  # the settings of its names
        storage=None if facts is None else StorageFacts(**facts),
    )


def tokens(engine: Engine) -> Tokens:
    """Token usage beside block usage (null figures with ``reason`` where the
    service cannot know them: ``Engine.unknown``)."""
    return Tokens(**analysis_views.tokens(engine.runtime, engine.unknown.get("tokens")))


def headline(engine: Engine) -> dict[str, Any]:
    """``pool_summary`` with the requests the service knows of: on a mirror
    the engine's (None where not known, ``requests_reason`` says why).  The
    summary and every stream frame's header carry it."""
    reqs = engine.request_counts()
    return {
        **pool_summary(engine.runtime),
        "running_requests": reqs["running"],
        "waiting_requests": reqs["waiting"],
        "requests_reason": reqs["reason"],
    }


def summary(engine: Engine) -> Summary:
    c = engine.counters
    reqs = engine.request_counts()
    counters = {
        "operations": c.ops,
        "operations_refused": c.ops_failed,
        "blocks_allocated": c.blocks_allocated,
        "blocks_freed": c.blocks_freed,
        "blocks_touched": c.blocks_touched,
        "blocks_cached": c.blocks_cached,
        "evictions": c.evictions,
        "resets": c.resets,
        "resets_refused": c.resets_refused,
        # on a mirror the engine's (None: not known, requests_reason says why)
        "requests_admitted": reqs["admitted"],
        "requests_refused": reqs["refused"],
        "requests_finished": reqs["finished"],
        "events": dict(c.events),
    }
    event_log = EventLogInfo(
        last_seq=engine.events.last_seq,
        first_seq=engine.events.first_seq,
        dropped=engine.events.dropped,
        lost_before_tick=engine.events_lost_to_ticks,
    )
    return Summary(
        **headline(engine),
        groups=list(engine.manager.group_ids),
        tokens=tokens(engine),
        counters=counters,
        event_log=event_log,
        uptime_s=time.time() - engine.started_at,
    )
