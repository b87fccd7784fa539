"""The smallest fleet of a sweep that meets the operator's targets.

Among the swept configurations, those whose hit rate reaches
``target_hit_rate`` and (timed mode) whose TTFT p99 is at most
``target_ttft_p99_ms``; the smallest is the one of least total memory
(bytes when a model layout gives them, else blocks), then of fewer
replicas, then first in the sweep's order.  An answer per router and one
over all.  The answer is one of the swept points: no search between them
(a finer ``--capacity`` list or more ``--replicas`` narrows it).  A
configuration whose figure is not known (no TTFT in sequence mode, an
unbounded pool's size) never meets a target on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blockpool.trace.fleet.results import FleetResult


@dataclass
class FleetTarget:
    target_hit_rate: float | None
    target_ttft_p99_ms: float | None
    best: FleetResult | None
    per_router: dict[str, FleetResult | None]

    def to_json(self) -> dict[str, Any]:
        def pick(r: FleetResult | None) -> dict[str, Any] | None:
            if r is None:
                return None
            return {
                "replicas": r.job.replicas,
                "capacity": r.job.capacity,
                "router": r.job.router,
                "free_order": r.job.free_order,
                "total_bytes": r.job.total_bytes,
                "total_blocks": r.job.total_blocks,
                "hit_rate": r.hit_rate,
                "ttft_p99_ms": r.ttft_p99,
            }

        return {
            "target_hit_rate": self.target_hit_rate,
            "target_ttft_p99_ms": self.target_ttft_p99_ms,
            "smallest": pick(self.best),
            "smallest_per_router": {k: pick(v) for k, v in self.per_router.items()},
        }


def check_targets(target_hit_rate: float | None, target_ttft_p99_ms: float | None) -> None:
    if target_hit_rate is not None and not 0 < target_hit_rate <= 1:
        raise ValueError(f"--target-hit-rate must be in (0, 1], got {target_hit_rate!r}")
    if target_ttft_p99_ms is not None and not target_ttft_p99_ms > 0:
        raise ValueError(f"--target-ttft-p99 must be > 0 ms, got {target_ttft_p99_ms!r}")


def meets(r: FleetResult, hit_rate: float | None, ttft_p99_ms: float | None) -> bool:
    if r.job.total_blocks is None:
        return False
    if hit_rate is not None:
        h = r.hit_rate
        if h is None or h < hit_rate:
            return False
    if ttft_p99_ms is not None:
        p = r.ttft_p99
        if p is None or p > ttft_p99_ms:
            return False
    return True


def _size(r: FleetResult) -> tuple[int, int, int]:
    j = r.job
    b = j.total_bytes
    return (b if b is not None else 0, j.total_blocks or 0, j.replicas)


def smallest_fleet(
    results: list[FleetResult],
    target_hit_rate: float | None = None,
    target_ttft_p99_ms: float | None = None,
) -> FleetTarget:
    check_targets(target_hit_rate, target_ttft_p99_ms)
    if target_hit_rate is None and target_ttft_p99_ms is None:
        raise ValueError("no target given")
    ok = [r for r in results if meets(r, target_hit_rate, target_ttft_p99_ms)]
    best = min(ok, key=_size) if ok else None
    per: dict[str, FleetResult | None] = {}
    for r in results:
        per.setdefault(r.job.router, None)
    for name in per:
        mine = [r for r in ok if r.job.router == name]
        per[name] = min(mine, key=_size) if mine else None
    return FleetTarget(target_hit_rate, target_ttft_p99_ms, best, per)
