"""One cumulative-bucket histogram (Prometheus semantics), and its buckets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Seconds: vLLM's residency buckets (kv_block_lifetime_seconds and friends).
SECONDS_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5,
    10, 20, 30, 60, 120, 300, 600, 1200, 1800,
)  # fmt: skip
# Counts (queue positions, allocations): powers of 2 up to 2^22.
COUNT_BUCKETS = tuple(float(1 << k) for k in range(0, 23))


class BucketHistogram:
    """Counts per bucket (a value falls in the first bucket >= it; the last
    count is +Inf), their sum and count."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        lo, hi = 0, len(self.buckets)
        b = self.buckets
        while lo < hi:  # first bucket >= value
            mid = (lo + hi) // 2
            if b[mid] < value:
                lo = mid + 1
            else:
                hi = mid
        self.counts[lo] += 1
        self.sum += value
        self.count += 1

    def observe_many(self, values: Any) -> None:
        """Observe a numpy array (vectorised)."""
        import numpy as np

        arr = np.asarray(values, dtype=np.float64)
        if not arr.size:
            return
        idx = np.searchsorted(np.asarray(self.buckets), arr, side="left")
        counts = np.bincount(idx, minlength=len(self.counts))
        for i, c in enumerate(counts.tolist()):
            self.counts[i] += c
        self.sum += float(arr.sum())
        self.count += int(arr.size)

    def cumulative(self) -> list[tuple[float, int]]:
        out, acc = [], 0
        for bound, c in zip((*self.buckets, math.inf), self.counts, strict=True):
            acc += c
            out.append((bound, acc))
        return out

    def quantile(self, q: float) -> float | None:
        """An upper-bound estimate (the bucket bound holding the q-quantile)."""
        if not self.count:
            return None
        target = q * self.count
        acc = 0
        for bound, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            if acc >= target:
                return bound
        return math.inf

    def as_json(self) -> dict[str, Any]:
        return {
            "buckets": [*self.buckets, "+Inf"],
            "counts": list(self.counts),
            "sum": self.sum,
            "count": self.count,
            "p50": _finite(self.quantile(0.5)),
            "p90": _finite(self.quantile(0.9)),
            "p99": _finite(self.quantile(0.99)),
        }


def _finite(v: float | None) -> float | str | None:
    if v is None:
        return None
    return v if math.isfinite(v) else "+Inf"
