"""What every route returns, as pydantic models, for the docs (``/docs``,
``/openapi.json``) and for the schema checks of the suite.

The models document; they do not re-shape: each route declares its model with
``responses=returns(Model)`` and still returns its plain ``dict``, serialised as
before (no validation pass, no key dropped or re-typed, nothing slower).  The
suite holds the two together: schemathesis validates every response against
these schemas, and tests/app/test_docs_offline.py checks real responses of
every operation against them, and that every top-level key they hold is
declared here.  ``extra="allow"``: a model names what is there today without
promising that nothing will ever be added.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Out(BaseModel):
    model_config = ConfigDict(extra="allow")


def returns(model: type[BaseModel], status: int = 200) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: its success status documented by ``model``."""
    doc = (model.__doc__ or model.__name__).strip().splitlines()[0]
    return {status: {"model": model, "description": doc}}


Hashes = list[str]
Ids = list[int]
PerGroupIds = list[list[int]]


# ------------------------------------------------------------------ the pool


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
    held: int
    slots_reserved: int
    tail_waste: int
    capacity: int
    usage_ratio: float
    fill_ratio: float


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
    running_requests: int
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


# ---------------------------------------------------------------- inspect


class Block(Out):
    """One block: state, references, hash, queue position, sampled metrics."""

    block_id: int
    state: str
    ref_cnt: int
    is_null: bool
    raw_refs: int
    requests: list[str] = Field(description="the requests holding it")
    block_hash: str | None
    hash64: str | None
    group_id: int | None
    copies_under_hash: int
    queue_position: int | None = Field(description="0 = the next block to be reused")
    queue_stamp: int
    metrics: dict[str, Any] | None = Field(description="when the block is sampled")


class QueueItem(Out):
    position: int
    block_id: int
    cached: bool
    hash64: str | None


class Queue(Out):
    """A page of the free queue, in eviction order."""

    total: int
    cached: int
    offset: int
    limit: int
    items: list[QueueItem]


class HashMapItem(Out):
    block_hash: str
    hash64: str
    group_id: int
    block_ids: Ids
    multi: bool


class HashMap(Out):
    """A page of the hash -> block map."""

    total_keys: int
    matched: int
    matched_multi: int
    offset: int
    limit: int
    items: list[HashMapItem]


class TreeNode(Out):
    hash: str
    parent: str | None
    block_ids: Ids


class PrefixTree(Out):
    """Cached hashes with their parents: the tree of shared prefixes."""

    total: int
    limit: int
    roots: int
    nodes: list[TreeNode]


class Event(Out):
    seq: int
    ts: float
    type: str


class Events(Out):
    """KV events after ``since`` (``truncated``: some were already dropped)."""

    since: int
    last_seq: int
    first_seq: int
    truncated: bool
    dropped_total: int
    next: int
    items: list[Event]


class Histogram(Out):
    buckets: list[float | Literal["+Inf"]] = Field(description="upper bounds, the last '+Inf'")
    cumulative_counts: list[int]
    sum: float
    count: int


class Samples(Out):
    """Eviction samples (residency) and their histograms."""

    since: int
    last_seq: int
    truncated: bool
    dropped_total: int
    next: int
    sample_rate: float
    items: list[dict[str, Any]]
    histograms: dict[str, Histogram]


class Series(Out):
    """Recent time-series points (one per tick)."""

    tick_hz: float
    points: list[dict[str, Any]]


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


# --------------------------------------------------------------- requests


class Admitted(Out):
    """The request's blocks per group, its prefix hit and what was computed."""

    request_id: str
    block_ids: PerGroupIds
    num_tokens: int
    num_hit_blocks: int
    num_computed_tokens: int
    num_new_blocks: int


class RequestItem(Out):
    request_id: str
    num_tokens: int
    num_blocks: int
    num_hit_blocks: int


class Requests(Out):
    """A page of the running requests."""

    total: int
    offset: int
    limit: int
    items: list[RequestItem]


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
    requests_running: int
    requests_waiting: int
    stats: dict[str, int]


# --------------------------------------------------------------- analysis


class Misses(Out):
    """Why prefixes missed, by reason, with evicted-miss and floor histograms."""

    admissions: int
    hit: dict[str, int]
    missed: dict[str, int]
    reasons: dict[str, dict[str, float]]
    evicted_misses: dict[str, Any]
    floor: dict[str, Any]
    evictions: dict[str, Any]
    recent_requests: list[dict[str, Any]]
    indexes: dict[str, Any] = Field(description="what the miss indexes hold")
    worker: dict[str, Any] | None = Field(description="the analysis worker's lag (worker mode)")


class RequestMisses(Out):
    """One request's blocks: hit, or the reason each missed."""

    request_id: str
    admitted_at: float
    finished: bool
    num_prompt_tokens: int
    num_prompt_blocks: int
    num_hit_blocks: int
    misses: dict[str, int]
    finished_at: float | None
    lora_name: str | None
    cache_salt: str | None
    blocks: list[dict[str, Any]]
    worker: dict[str, Any] | None


class Regret(Out):
    """Evicted blocks asked for again: ratio, gaps, top prefixes, latest."""

    regrets_total: int
    evictions_total: int
    regret_ratio: float | None
    regrets_per_s: float
    evictions_per_s: float
    window_seconds: float
    gap_seconds: dict[str, Any]
    top_prefixes: list[dict[str, Any]]
    recent: list[dict[str, Any]]
    worker: dict[str, Any] | None


class Shadows(Out):
    """What-if pools: other capacities and free orders, over the same span."""

    enabled: bool
    real: dict[str, Any] | None = None
    shadows: list[dict[str, Any]] = []
    curve: dict[str, list[dict[str, Any]]] = {}
    mode: str | None = Field(default=None, description="where the shadows run")
    running: bool | None = None
    since: float | None = None
    updated: float | None = None
    lag_accesses: int | None = None
    sent_accesses: int | None = None
    applied_accesses: int | None = None
    dropped_accesses: int | None = None
    resyncs: int | None = None
    error: str | None = None
    worker: dict[str, Any] | None = None


class Keyframe(Out):
    seq: int
    ts: float


class History(Out):
    """The recording: the span it holds, its keyframes, its limits."""

    enabled: bool
    first_seq: int | None = None
    last_seq: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None
    ops_held: int | None = None
    bytes_held: int | None = None
    dropped_ops: int | None = None
    dropped_segments: int | None = None
    keyframes: list[Keyframe] = []
    keyframes_taken: int | None = None
    keyframe_seconds_total: float | None = None
    limits: dict[str, int] | None = None


class Moment(Out):
    seq: int
    ts: float | None


class HistoryState(Out):
    """The pool right after a recorded operation."""

    at: Moment
    keyframe_seq: int
    replayed_ops: int
    replay_mismatches: int
    replay_seconds: float
    summary: dict[str, Any]
    queue: dict[str, Any]
    hash_map: dict[str, Any]
    requests: dict[str, Any]
    blocks: dict[str, list[Any]] | None = Field(default=None, description="with include_blocks")


class HistoryDiff(Out):
    """What changed between two recorded moments."""

    from_: Moment = Field(alias="from")
    to: Moment
    evicted_total: int
    evicted: list[Any]
    entered_total: int
    entered: list[dict[str, Any]]
    blocks_changed_total: int
    blocks_changed: list[dict[str, Any]]
    requests: dict[str, Any]
    ops: dict[str, Any]
    events: dict[str, int]
    replayed_ops: int
