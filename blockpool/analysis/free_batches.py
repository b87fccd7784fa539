"""The log of free batches: it turns a block's free-queue stamp into its
position in the queue when it was freed.

Each batch of blocks appended at the queue's tail is one row (first stamp,
count, free blocks before it, allocation counter, time).  A batch's stamps
follow each other, so a stamp's batch is found by bisection (vectorised).
The log is bounded: when it is full, the older half is dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class FreeBatches:
    """Free batches, oldest first, as numpy columns."""

    def __init__(self) -> None:
        cap = 1 << 16
        self.fb_first = np.zeros(cap, dtype=np.int64)
        self.fb_count = np.zeros(cap, dtype=np.int64)
        self.fb_nf = np.zeros(cap, dtype=np.int64)
        self.fb_alloc = np.zeros(cap, dtype=np.int64)
        self.fb_ts = np.zeros(cap, dtype=np.float64)
        self.fb_len = 0

    def note_freed(
        self, first_stamp: int, count: int, nf_before: int, alloc: int, ts: float
    ) -> None:
        """Blocks got queue stamps ``first_stamp .. +count`` (appended at the
        tail in that order, after ``nf_before`` free blocks)."""
        if count <= 0:
            return
        i = self.fb_len
        if i == len(self.fb_first):
            half = i // 2
            for arr in (self.fb_first, self.fb_count, self.fb_nf, self.fb_alloc, self.fb_ts):
                arr[: i - half] = arr[half:i]
            i = self.fb_len = i - half
        self.fb_first[i] = first_stamp
        self.fb_count[i] = count
        self.fb_nf[i] = nf_before
        self.fb_alloc[i] = alloc
        self.fb_ts[i] = ts
        self.fb_len = i + 1

    def travel(self, stamps: np.ndarray, allocs: np.ndarray, ts: np.ndarray) -> tuple[Any, ...]:
        """Vectorised: (ok mask, queue position when freed, allocations
        between free and eviction, seconds in the queue)."""
        n = self.fb_len
        first = self.fb_first[:n]
        b = np.searchsorted(first, stamps, side="right") - 1
        ok = b >= 0
        b = np.where(ok, b, 0)
        ok &= stamps < first[b] + self.fb_count[b]
        pos = self.fb_nf[b] + stamps - first[b]
        between = allocs - self.fb_alloc[b]
        in_queue = np.maximum(ts - self.fb_ts[b], 0.0)
        return ok, pos, between, in_queue
