"""Eviction regret: a hash stored again while the eviction ring remembers its
removal is a regret, with the gap in seconds since the eviction.

Counted in total (the gaps in a histogram, at tick time), per root prefix
(the hash of the request's first block; the most regretted are kept) and
as a short list of the latest.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blockpool.analysis.common import SECONDS_BUCKETS, Hist, hex64
from blockpool.common.keys import digest64

if TYPE_CHECKING:
    from blockpool.analysis.evictions import EvictionRing

RECENT_REGRETS = 200
TOP_ROOTS_KEPT = 10_000


@dataclass
class RootRegret:
    root: int
    regrets: int = 0
    gap_sum: float = 0.0
    last_gap: float = 0.0
    last_ts: float = 0.0
    max_depth: int = 0
    last_victim: str | None = None
    last_owner: str | None = None
    first_tokens: list[int] = field(default_factory=list)
    lora_name: str | None = None
    cache_salt: str | None = None


class RegretTracker:
    """Regrets found against the eviction ring ``ring`` (which forgets a
    hash's eviction once the hash is stored again)."""

    def __init__(self, ring: EvictionRing) -> None:
        self.ring = ring
        self.regrets = 0
        self.regret_gap = Hist(SECONDS_BUCKETS)
        self._pending_gaps: list[float] = []
        self.recent_regrets: deque[tuple[float, int, float, int, str | None, int]] = deque(
            maxlen=RECENT_REGRETS
        )
        self.roots: dict[int, RootRegret] = {}

    def record(
        self,
        hashes: Any,
        found: list[tuple[int, int]],
        now: float,
        victim: str | None,
        root: int,
        owner: str | None,
        tokens: list[int] | None,
        lora: str | None,
        salt: str | None,
    ) -> None:
        """Hashes (``hashes[i]`` for each (i, ring serial) in ``found``)
        stored again after their eviction."""
        ring = self.ring
        size, r_ts, ev = ring.size, ring.r_ts, ring.evicted
        gaps = self._pending_gaps
        recent = self.recent_regrets
        gap_sum = 0.0
        depth = 0
        gap = 0.0
        for i, serial in found:
            hv = digest64(hashes[i])
            gap = now - r_ts[serial % size]
            if gap < 0:
                gap = 0.0
            ev.pop(hv, None)
            gaps.append(gap)
            gap_sum += gap
            depth = max(depth, i)
            recent.append((now, hv, gap, i, victim, root))
        self.regrets += len(found)
        agg = self.roots.get(root)
        if agg is None:
            if len(self.roots) >= TOP_ROOTS_KEPT:
                keep = heapq.nlargest(TOP_ROOTS_KEPT // 2, self.roots.values(), key=_by_regrets)
                self.roots = {r.root: r for r in keep}
            agg = self.roots[root] = RootRegret(
                root,
                first_tokens=list(tokens[:16]) if tokens is not None else [],
                lora_name=lora,
                cache_salt=salt,
            )
        agg.regrets += len(found)
        agg.gap_sum += gap_sum
        agg.last_gap = gap
        agg.last_ts = now
        agg.max_depth = max(agg.max_depth, depth)
        agg.last_victim = victim
        if owner is not None and owner != victim:
            agg.last_owner = owner

    def process(self) -> None:
        """Tick time: the gaps since the last call, into the histogram."""
        if self._pending_gaps:
            self.regret_gap.observe_many(self._pending_gaps)
            self._pending_gaps = []

    def top_roots(self, limit: int) -> list[RootRegret]:
        return heapq.nlargest(limit, self.roots.values(), key=_by_regrets)

    def recent_regret_rows(self, limit: int) -> list[dict[str, Any]]:
        rows = list(self.recent_regrets)[-limit:]
        return [
            {
                "ts": ts,
                "hash64": hex64(hv),
                "gap_seconds": gap,
                "block_index": depth,
                "request_id": victim,
                "root": hex64(root),
            }
            for ts, hv, gap, depth, victim, root in reversed(rows)
        ]


def _by_regrets(r: RootRegret) -> tuple[int, float]:
    return (r.regrets, r.last_ts)
