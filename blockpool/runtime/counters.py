"""The runtime's counters: operation and event tallies (``/metrics``, the
summary).  The residency histograms use blockpool.common.histogram."""

from __future__ import annotations

from dataclasses import dataclass, field

from blockpool.common.histogram import SECONDS_BUCKETS, BucketHistogram

# vLLM's residency buckets (seconds) for the eviction-sample histograms.
RESIDENCY_BUCKETS = SECONDS_BUCKETS

__all__ = ["RESIDENCY_BUCKETS", "BucketHistogram", "Counters"]


@dataclass
class Counters:
    ops: int = 0
    ops_failed: int = 0
    blocks_allocated: int = 0
    blocks_freed: int = 0
    blocks_touched: int = 0
    blocks_cached: int = 0
    evictions: int = 0
    resets: int = 0
    resets_refused: int = 0
    requests_admitted: int = 0
    requests_refused: int = 0
    requests_finished: int = 0
    events: dict[str, int] = field(
        default_factory=lambda: {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
    )
