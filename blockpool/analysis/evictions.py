"""The eviction ring: the evictions the analysis remembers, and how far each
evicted block had travelled through the free queue.

A ring of ``miss_index_size`` evictions (hash, block, free-queue stamp,
allocation serial, time, cause, taker; arrays, so the garbage collector has
nothing to walk) with a dict hash -> ring serial.  An eviction is forgotten
once the ring has moved past it (it is then ``expired``), or once its hash
is stored again (a regret: ``regret.py``).

At tick time (``process``) the evictions since the last tick become queue
travel -- position when freed, allocations between the free and the
eviction, seconds in the queue -- through the log of free batches
(``free_batches.py``); only evictions by reuse travelled the queue.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from blockpool.analysis.common import COUNT_BUCKETS, SECONDS_BUCKETS, Hist
from blockpool.common.miss_reasons import CAUSES, EVICT_OP, RESET, REUSE

if TYPE_CHECKING:
    from blockpool.analysis.free_batches import FreeBatches
    from blockpool.runtime.columns import BlockColumns


class EvictionRing:
    """The last ``size`` evictions, by ring serial, and their queue travel."""

    def __init__(self, columns: BlockColumns, size: int, batches: FreeBatches) -> None:
        self.cols = columns
        self.size = size
        self.batches = batches
        # every eviction: travel through the queue (at tick time)
        self.evictions = [0, 0, 0]  # per cause
        self.ev_pos = Hist(COUNT_BUCKETS)
        self.ev_allocs = Hist(COUNT_BUCKETS)
        self.ev_queue_s = Hist(SECONDS_BUCKETS)
        self._processed = 0
        # the ring (array.array: untracked by the garbage collector, cheap scalar writes)
        e = size
        self.r_h64 = array("Q", bytes(8 * e))
        self.r_bid = array("q", bytes(8 * e))
        self.r_stamp = array("q", bytes(8 * e))
        self.r_alloc = array("q", bytes(8 * e))
        self.r_ts = array("d", bytes(8 * e))
        self.r_cause = array("b", bytes(e))
        self.r_by: list[str | None] = [None] * e
        # numpy views of the same memory, for bulk writes and tick-time reads
        self.v_h64 = np.frombuffer(self.r_h64, dtype=np.uint64)
        self.v_bid = np.frombuffer(self.r_bid, dtype=np.int64)
        self.v_stamp = np.frombuffer(self.r_stamp, dtype=np.int64)
        self.v_alloc = np.frombuffer(self.r_alloc, dtype=np.int64)
        self.v_ts = np.frombuffer(self.r_ts, dtype=np.float64)
        self.v_cause = np.frombuffer(self.r_cause, dtype=np.int8)
        self.ev_serial = 0
        self.evicted: dict[int, int] = {}  # h64 -> ring serial

    # ------------------------------------------------------------ recording

    def record_evictions(
        self, new_ids: list[int], alloc_base: int, cause: int, by: str | None, now: float
    ) -> list[int]:
        """The blocks in ``new_ids`` (in pop order) were just taken; those the
        (not yet synced) columns show hashed lost their hash.  Returns the
        hashes (64-bit) evicted."""
        cols = self.cols
        hashed = cols.hashed
        if len(new_ids) <= 4:
            hv = []
            for k, b in enumerate(new_ids):
                if hashed[b]:
                    v = int(cols.hash64[b])
                    s = self.ev_serial
                    j = s % self.size
                    self.r_bid[j] = b
                    self.r_h64[j] = v
                    self.r_stamp[j] = int(cols.stamp[b])
                    self.r_alloc[j] = alloc_base + k
                    self.r_ts[j] = now
                    self.r_cause[j] = cause
                    self.r_by[j] = by
                    self.evicted[v] = s
                    self.ev_serial = s + 1
                    self.evictions[cause] += 1
                    hv.append(v)
            if hv and len(self.evicted) > self.size + (self.size >> 2):
                floor = self.ev_serial - self.size
                self.evicted = {h: x for h, x in self.evicted.items() if x >= floor}
            return hv
        arr = np.array(new_ids, dtype=np.int64)
        posa = np.flatnonzero(hashed[arr])
        if not len(posa):
            return []
        ida = arr[posa]
        return self._ring_put(ida, posa + alloc_base, cause, by, now)

    def _ring_put(
        self, ida: np.ndarray, allocs: Any, cause: int, by: str | None, now: float
    ) -> list[int]:
        """Evictions of the blocks ``ida`` (pre-state read from the columns)."""
        cols = self.cols
        k = len(ida)
        e = self.size
        s0 = self.ev_serial
        hva = cols.hash64[ida]
        sta = cols.stamp[ida]
        ala = np.broadcast_to(np.asarray(allocs, dtype=np.int64), (k,))
        if k > e:  # more than the ring holds: keep the last e
            ida, hva, sta, ala = ida[-e:], hva[-e:], sta[-e:], ala[-e:]
            s0 += k - e
            k = e
        j = s0 % e
        first = min(k, e - j)
        for view, vals in (
            (self.v_bid, ida),
            (self.v_h64, hva),
            (self.v_stamp, sta),
            (self.v_alloc, ala),
        ):
            view[j : j + first] = vals[:first]
            if first < k:
                view[: k - first] = vals[first:]
        self.v_ts[j : j + first] = now
        self.v_cause[j : j + first] = cause
        self.r_by[j : j + first] = [by] * first
        if first < k:
            self.v_ts[: k - first] = now
            self.v_cause[: k - first] = cause
            self.r_by[: k - first] = [by] * (k - first)
        hv: list[int] = hva.tolist()
        ev = self.evicted
        ev.update(zip(hv, range(s0, s0 + k), strict=True))
        self.ev_serial = s0 + k
        self.evictions[cause] += k
        if len(ev) > e + (e >> 2):
            floor = self.ev_serial - e
            self.evicted = {h: x for h, x in ev.items() if x >= floor}
        return hv

    def record_reset(self, now: float, alloc: int) -> None:
        ids = np.flatnonzero(self.cols.hashed)
        if len(ids):
            self._ring_put(ids, alloc, RESET, None, now)

    def record_evict_op(self, ids: list[int], alloc: int, now: float) -> None:
        if ids:
            self._ring_put(np.array(ids, dtype=np.int64), alloc, EVICT_OP, "evict_op", now)

    # -------------------------------------------------------------- reading

    def eviction(self, hv: int) -> int:
        """The ring serial of the last remembered eviction of ``hv``, or -1."""
        s = self.evicted.get(hv)
        if s is None or s < self.ev_serial - self.size:
            return -1
        return s

    def by_reset(self, serial: int) -> bool:
        """Whether the (held) eviction ``serial`` was a prefix-cache reset's."""
        return bool(self.r_cause[serial % self.size] == RESET)

    def eviction_info(self, serial: int, at: float) -> dict[str, Any]:
        """One eviction, seen from time ``at``; ``expired`` once the ring
        has moved past it."""
        if serial < self.ev_serial - self.size:
            return {"expired": True}
        j = serial % self.size
        ts = self.r_ts[j]
        cause = self.r_cause[j]
        info: dict[str, Any] = {
            "evicted_ago_seconds": max(0.0, at - ts),
            "evicted_at": ts,
            "cause": CAUSES[cause],
            "block_id": self.r_bid[j],
            "evicted_by": self.r_by[j],
            "queue_position_when_freed": None,
            "allocations_between": None,
            "touched_out_ahead": None,
            "seconds_in_queue": None,
        }
        if cause == REUSE and self.batches.fb_len:
            ok, pos, between, in_queue = self.batches.travel(
                np.array([self.r_stamp[j]]), np.array([self.r_alloc[j]]), np.array([ts])
            )
            if ok[0]:
                p, a = int(pos[0]), int(between[0])
                info.update(
                    queue_position_when_freed=p,
                    allocations_between=a,
                    touched_out_ahead=max(0, p - a),
                    seconds_in_queue=float(in_queue[0]),
                )
        return info

    def ring_arrays(self, serials: list[int]) -> tuple[np.ndarray, ...]:
        """Ring columns (stamp, allocation, time, cause) for ``serials``."""
        idx = [s % self.size for s in serials]
        st, al, ts, ca = self.r_stamp, self.r_alloc, self.r_ts, self.r_cause
        return (
            np.array([st[j] for j in idx], dtype=np.int64),
            np.array([al[j] for j in idx], dtype=np.int64),
            np.array([ts[j] for j in idx], dtype=np.float64),
            np.array([ca[j] for j in idx], dtype=np.int64),
        )

    def _ring_range(self, start: int, end: int) -> tuple[np.ndarray, ...]:
        """Ring columns for serials ``start .. end`` (held ones), by slices."""
        e = self.size
        j0, j1 = start % e, end % e
        views = (self.v_stamp, self.v_alloc, self.v_ts, self.v_cause)
        if j0 < j1 or end - start == 0:
            return tuple(v[j0:j1].copy() for v in views)
        return tuple(np.concatenate((v[j0:], v[:j1])) for v in views)

    def evicted_remembered(self) -> int:
        floor = self.ev_serial - self.size
        return sum(1 for s in self.evicted.values() if s >= floor)

    # ------------------------------------------------------------ tick time

    def process(self) -> None:
        """Tick time, vectorised: queue travel of the evictions since the
        last call."""
        end = self.ev_serial
        start = max(self._processed, end - self.size)
        self._processed = end
        if start >= end or not self.batches.fb_len:
            return
        st, al, ts, ca = self._ring_range(start, end)
        ok, pos, between, in_queue = self.batches.travel(st, al, ts)
        ok &= ca == REUSE
        if ok.any():
            self.ev_pos.observe_many(pos[ok])
            self.ev_allocs.observe_many(between[ok])
            self.ev_queue_s.observe_many(in_queue[ok])
