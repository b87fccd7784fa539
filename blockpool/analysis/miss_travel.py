"""The evicted misses' histograms: how long before the miss their block was
evicted and, for an eviction by reuse, how far it had travelled in the free
queue (its position when freed, the allocations between).  Kept alike by
the service's miss tracker (``misses.py``) and a mirror's (``engine_misses.py``)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from blockpool.analysis.common import COUNT_BUCKETS, SECONDS_BUCKETS, Hist
from blockpool.analysis.evictions import EvictionRing
from blockpool.analysis.free_batches import FreeBatches
from blockpool.common.miss_reasons import REUSE


class MissTravel:
    """``ago`` (seconds), ``miss_pos`` and ``miss_allocs`` (counts)."""

    def __init__(self) -> None:
        self.ago = Hist(SECONDS_BUCKETS)
        self.miss_pos = Hist(COUNT_BUCKETS)
        self.miss_allocs = Hist(COUNT_BUCKETS)

    def observe(
        self,
        ring: EvictionRing,
        batches: FreeBatches,
        serials: list[int],
        at: float | npt.NDArray[np.float64],
    ) -> None:
        """The evictions ``serials`` (in ``ring``) missed at ``at`` (one
        time, or one per serial); their travel from the log of free batches."""
        st, al, ts, ca = ring.ring_arrays(serials)
        self.ago.observe_many(np.maximum(at - ts, 0.0))
        if batches.fb_len:
            ok, pos, between, _ = batches.travel(st, al, ts)
            ok &= ca == REUSE
            self.miss_pos.observe_many(pos[ok])
            self.miss_allocs.observe_many(between[ok])
