"""One fleet configuration replayed: :func:`run_job`.

:class:`FleetSpec` holds what every job of a sweep shares (mode, block size,
hash, router settings, timed mode's scheduler and step model);
:class:`~blockpool.trace.fleet.results.FleetJob` what varies (replicas,
capacity per replica, router, free order).  A job is a pure function of
the trace, the spec and itself: the sweep runs jobs in any order, on any
process or Ray worker, and gets the same results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from blockpool.core.free_order import FREE_ORDERS
from blockpool.core.hashing import get_hash_fn_by_name
from blockpool.trace.fleet.results import FleetJob, FleetResult
from blockpool.trace.fleet.routers import (
    DEFAULT_OVERLAP_WEIGHT,
    DEFAULT_SESSION_IDS,
    make_router,
)
from blockpool.trace.fleet.sequence import FleetSequence
from blockpool.trace.fleet.setup import FleetSetup
from blockpool.trace.fleet.timed import FleetTimed
from blockpool.trace.sched.engine_core import StepModel
from blockpool.trace.sched.timed import TimedConfig, simple_scheduler
from blockpool.trace.workload.reader import Trace

MODES = ("sequence", "timed")


@dataclass(frozen=True)
class FleetSpec:
    mode: str = "sequence"
    block_size: int = 16
    hash_name: str = "sha256"
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    session_ids: int = DEFAULT_SESSION_IDS
    timed: TimedConfig = field(default_factory=TimedConfig)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r} (known: {', '.join(MODES)})")
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise ValueError(f"block size must be a positive integer, got {bs!r}")
        get_hash_fn_by_name(self.hash_name)  # refuses an unknown hash
        if self.timed.groups:
            raise ValueError("fleet planning models one full-attention KV-cache group")


def run_job(
    trace: Trace,
    spec: FleetSpec,
    job: FleetJob,
    progress: Callable[[int, int], None] | None = None,
) -> FleetResult:
    """Replay ``trace`` on ``job``'s fleet."""
    if job.free_order not in FREE_ORDERS:
        raise ValueError(f"unknown free order {job.free_order!r}")
    hash_fn = get_hash_fn_by_name(spec.hash_name)
    router = make_router(
        job.router, trace, overlap_weight=spec.overlap_weight, session_ids=spec.session_ids
    )
    cap_tokens = None if job.blocks is None else job.blocks * spec.block_size
    setup = FleetSetup(
        trace, spec.block_size, job.replicas, job.blocks, hash_fn, router, job.free_order,
        cap_tokens,
    )  # fmt: skip
    fleet: FleetSequence | FleetTimed
    if spec.mode == "sequence":
        fleet = FleetSequence(setup)
        per = fleet.run(progress)
        ttft = queue = None
    else:
        cfg = spec.timed
        sched = cfg.scheduler or simple_scheduler(cfg.max_running)
        fleet = FleetTimed(setup, sched, cfg.step_model or StepModel(cfg.step_ms), cfg.speed)
        per = fleet.run(progress)
        ttft, queue = fleet.fleet_times()
    return FleetResult(
        job,
        spec.mode,
        per,
        [r.routed_requests for r in fleet.replicas],
        [r.routed_tokens for r in fleet.replicas],
        ttft,
        queue,
        assignment=fleet.assignment,
    )
