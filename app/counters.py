"""The engine's counters: operation and event tallies, and the residency
histograms of the sampled evictions (``/metrics``, the summary)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# vLLM's residency buckets (seconds) for the eviction-sample histograms.
RESIDENCY_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5,
    10, 20, 30, 60, 120, 300, 600, 1200, 1800,
)  # fmt: skip


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics) kept by the engine."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # last = +Inf overflow
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = 0
        for i, bound in enumerate(self.buckets):  # noqa: B007
            if value <= bound:
                break
        else:
            i = len(self.buckets)
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        out, acc = [], 0
        for bound, c in zip((*self.buckets, float("inf")), self.counts, strict=True):
            acc += c
            out.append((bound, acc))
        return out


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
