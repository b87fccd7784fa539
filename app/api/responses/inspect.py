"""What the inspection routes return: blocks, queue, hash map, logs, storage."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from app.api.responses import Ids, Out
from app.api.responses.pool_routes import StorageBytes


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
    partial: bool = Field(
        False, description="some hashes' parents are not known (a mirror after a resync)"
    )
    unknown_parents: int = Field(0, description="hashes shown as roots, their parent unknown")


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
    fleet_url: str | None = None  # --fleet-url: the observer's page, or null


# --------------------------------------------------------------- requests
