"""Fleet planning: each replica an exact pool, checked against single-pool
replays fed the same routed requests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from blockpool import BlockPool, check_invariants, sha256
from blockpool.core.free_order import APPEND_ALL, FREE_ORDERS, FreeOrder
from blockpool.trace import Trace
from blockpool.trace.fleet import FleetJob, FleetSpec, make_router, run_job, run_sweep
from blockpool.trace.fleet.routers import ROUTERS, parse_routers, session_key
from blockpool.trace.fleet.sequence import FleetSequence
from blockpool.trace.fleet.setup import FleetSetup
from blockpool.trace.fleet.targets import smallest_fleet
from blockpool.trace.fleet.timed import FleetTimed
from blockpool.trace.plan.report import DEFAULT_FREE_ORDER, replay_trace
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.replay.sequence import SequencePools
from blockpool.trace.sched.engine_core import StepModel
from blockpool.trace.sched.scheduled import run_scheduled
from blockpool.trace.sched.scheduler import SchedulerConfig
from blockpool.trace.sched.timed import TimedConfig
from tests.trace.fleet_traces import conversation_trace
from tests.trace.helpers import HEAD50

BS = 16
TRACE = conversation_trace()
CAPS = (24, 40, 80, 160)  # blocks per replica (null block included)


def sub_trace(trace: Trace, indices: list[int]) -> Trace:
    """The requests at ``indices``, in order, as a trace of their own."""
    reqs = [replace(trace.requests[i], index=k) for k, i in enumerate(indices)]
    return Trace(reqs, trace.tokens_per_id, trace.source)


def fleet_seq(
    trace: Trace, n: int, blocks: int, router: str, free_order: FreeOrder = DEFAULT_FREE_ORDER
) -> FleetSequence:
    seq = FleetSequence(
        FleetSetup(
            trace,
            BS,
            n,
            blocks,
            sha256,
            make_router(router, trace),
            free_order=free_order,
            capacity_tokens=blocks * BS,
        )
    )
    seq.run()
    for rep in seq.replicas:
        check_invariants(rep.driver.pool)
    return seq


def counts(r: CapacityResult) -> tuple[Any, ...]:
    return (r.prompt_tokens, r.hit_tokens, r.evictions, r.refused, r.admitted, dict(r.miss_reasons))


@pytest.mark.parametrize("free_order", FREE_ORDERS)
@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_is_the_single_pool_replay(router: str, free_order: FreeOrder) -> None:
    # the aggregate against the one-pass curve (another algorithm), per capacity
    single = replay_trace(
        TRACE, block_size=BS, capacities_tokens=[c * BS for c in CAPS], free_order=free_order
    )
    assert single.one_pass
    # per request against the single-pool replay on a real pool
    pools = SequencePools(TRACE, BS, [c * BS for c in CAPS], sha256, free_order=free_order)
    per_request: list[list[int]] = [[] for _ in CAPS]
    for d, log in zip(pools.drivers, per_request, strict=True):
        step = d.step

        def logged(n: int, req: Any, hashes: Any, step: Any = step, log: list[int] = log) -> int:
            k: int = step(n, req, hashes)
            log.append(k)
            return k

        d.step = logged  # type: ignore[method-assign,assignment]
    pools.run()
    for k, cap in enumerate(CAPS):
        seq = fleet_seq(TRACE, 1, cap, router, free_order)
        assert seq.assignment == [0] * len(TRACE)
        assert seq.hits == per_request[k]
        assert counts(seq.replicas[0].driver.result) == counts(single.results[k])
    # the trace holds hits and evictions at these sizes: the check has teeth
    assert single.results[0].evictions > 0 and single.results[0].hit_tokens > 0
    assert len({r.hit_tokens for r in single.results}) == len(CAPS)


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_each_replica_equals_an_independent_pool_fed_its_routed_requests(
    router: str, n: int
) -> None:
    for cap in (24, 80):
        seq = fleet_seq(TRACE, n, cap, router)
        for j, rep in enumerate(seq.replicas):
            mine = [i for i, a in enumerate(seq.assignment) if a == j]
            assert rep.routed_requests == len(mine)
            alone = replay_trace(
                sub_trace(TRACE, mine), block_size=BS, capacities_tokens=[cap * BS]
            )
            assert counts(rep.driver.result) == counts(alone.results[0])
            assert (
                sum(h * BS for h in (seq.hits[i] for i in mine) if h > 0)
                == alone.results[0].hit_tokens
            )


def test_round_robin_deals_requests_in_turn() -> None:
    seq = fleet_seq(TRACE, 3, 40, "round_robin")
    assert seq.assignment == [i % 3 for i in range(len(TRACE))]


def test_prefix_aware_routes_no_worse_than_round_robin() -> None:
    spec = FleetSpec(block_size=BS)
    for n in (2, 3, 4, 8):
        for cap in CAPS:
            rr = run_job(TRACE, spec, FleetJob(n, str(cap), cap, "round_robin", "append_all"))
            pa = run_job(TRACE, spec, FleetJob(n, str(cap), cap, "prefix_aware", "append_all"))
            assert pa.hit_tokens >= rr.hit_tokens, (n, cap)
    # and strictly better somewhere: the router does find the cached prefixes
    rr4 = run_job(TRACE, spec, FleetJob(4, "80", 80, "round_robin", "append_all"))
    pa4 = run_job(TRACE, spec, FleetJob(4, "80", 80, "prefix_aware", "append_all"))
    assert pa4.hit_tokens > rr4.hit_tokens


def test_prefix_aware_trades_the_cached_prefix_against_the_load() -> None:
    # 3 replicas, 4-block prompts: A -> 0 (all tie), B (shares nothing) -> 1;
    # C shares A's 3 leading blocks (its last block holds the last token).
    # Cost w x (4 - overlap) + load, load = routed blocks beyond the least
    # routed replica's: replica 0 costs w + 4, replica 1 4w + 4, replica 2 4w.
    from blockpool.trace import parse_mooncake
    from tests.trace.helpers import row, rows_to_lines

    rows = [row(0, [1, 2, 3, 4], 64), row(1, [5, 6, 7, 8], 64), row(2, [1, 2, 3, 9], 64)]
    trace = parse_mooncake(rows_to_lines(rows), 16)
    for w, want, hits in ((1.0, [0, 1, 2], [0, 0, 0]), (2.0, [0, 1, 0], [0, 0, 3]),
                          (0.0, [0, 1, 2], [0, 0, 0])):  # fmt: skip
        router = make_router("prefix_aware", trace, overlap_weight=w)
        seq = FleetSequence(FleetSetup(trace, 16, 3, 40, sha256, router, DEFAULT_FREE_ORDER))
        seq.run()
        assert (seq.assignment, seq.hits) == (want, hits), w
        for rep in seq.replicas:
            check_invariants(rep.driver.pool)


def test_session_routes_a_conversation_to_one_replica() -> None:
    seq = fleet_seq(TRACE, 4, 80, "session")
    by_key: dict[bytes, set[int]] = {}
    for req, j in zip(TRACE.requests, seq.assignment, strict=True):
        by_key.setdefault(session_key(TRACE, req, 1), set()).add(j)
    assert all(len(v) == 1 for v in by_key.values())
    assert len(set(seq.assignment)) > 1  # and the keys spread over replicas


def test_least_loaded_keeps_routed_blocks_within_one_request() -> None:
    seq = fleet_seq(TRACE, 4, 80, "least_loaded")
    loads = [rep.routed_blocks for rep in seq.replicas]
    biggest = max(-(-r.input_length // BS) for r in TRACE.requests)
    assert max(loads) - min(loads) <= biggest


def test_bad_router_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown router 'nearest'"):
        parse_routers("round_robin,nearest")
    with pytest.raises(ValueError, match="no router"):
        parse_routers(" , ")
    with pytest.raises(ValueError, match="overlap weight"):
        make_router("prefix_aware", TRACE, overlap_weight=-1)
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        FleetJob(0, "x", 40, "round_robin", "append_all")
    with pytest.raises(ValueError, match="no usable block"):
        FleetJob(1, "x", 1, "round_robin", "append_all")


# ------------------------------------------------------------------ timed mode

SCHED = SchedulerConfig(64, 8, True, 0, None, "fcfs", True)
STEP = StepModel(5.0, 0.05, 0.2)


def timed_single(trace: Trace, blocks: int) -> CapacityResult:
    pool = BlockPool(blocks, True, BS, False)
    res = CapacityResult(blocks * BS, blocks)
    run_scheduled(trace, pool, BS, sha256, res, SCHED, STEP, 1.0)
    check_invariants(pool)
    return res


def timed_fleet(trace: Trace, n: int, blocks: int, router: str) -> FleetTimed:
    setup = FleetSetup(
        trace, BS, n, blocks, sha256, make_router(router, trace), APPEND_ALL, blocks * BS
    )
    fleet = FleetTimed(setup, SCHED, STEP, 1.0)
    fleet.run()
    for rep in fleet.replicas:
        check_invariants(rep.pool)
        assert rep.pool.get_num_free_blocks() == blocks - 1
    return fleet


def timed_counts(r: CapacityResult, clock: bool = True) -> tuple[Any, ...]:
    """What two timed replays must agree on (``clock``: the end time too; a
    fleet's replica idles on until the fleet's last arrival)."""
    x = r.extra
    keys = ("ttft_ms", "queue_ms", "prefix_cache_hits", "prefix_cache_queries", "steps",
            "rejected_too_long", *(("simulated_seconds",) if clock else ()))  # fmt: skip
    return (*counts(r), r.preemptions, *(x[k] for k in keys))


@pytest.mark.parametrize("router", ROUTERS)
def test_timed_one_replica_is_the_single_engine_replay(router: str) -> None:
    for cap in (24, 60):
        single = timed_single(TRACE, cap)
        fleet = timed_fleet(TRACE, 1, cap, router)
        assert timed_counts(fleet.replicas[0].result) == timed_counts(single)
    assert single.hit_tokens > 0
    assert timed_single(TRACE, 24).preemptions > 0  # the small pool preempts: a real check


@pytest.mark.parametrize("router", ROUTERS)
def test_timed_replicas_equal_independent_engines_fed_their_requests(router: str) -> None:
    fleet = timed_fleet(TRACE, 3, 30, router)
    for j, rep in enumerate(fleet.replicas):
        mine = [i for i, a in enumerate(fleet.assignment) if a == j]
        alone = timed_single(sub_trace(TRACE, mine), 30)
        assert timed_counts(rep.result, False) == timed_counts(alone, False)
    ttft, _ = fleet.fleet_times()
    assert ttft["p99"] is not None and ttft["p99"] > 0


def test_timed_least_loaded_and_prefix_aware_see_the_live_load() -> None:
    spec = FleetSpec("timed", BS, timed=TimedConfig(scheduler=SCHED, step_model=STEP))
    rr = run_job(TRACE, spec, FleetJob(3, "30", 30, "round_robin", "append_all"))
    pa = run_job(TRACE, spec, FleetJob(3, "30", 30, "prefix_aware", "append_all"))
    assert pa.hit_tokens >= rr.hit_tokens
    assert rr.ttft_ms is not None and pa.ttft_ms is not None
    assert rr.queue_ms is not None and rr.queue_ms["p99"] is not None


# ------------------------------------------------------------------ sweeps and targets


def sweep_jobs() -> list[FleetJob]:
    return [
        FleetJob(n, str(c), c, r, "append_all", block_bytes=1000)
        for n in (1, 2, 4)
        for c in (24, 80)
        for r in ROUTERS
    ]


def test_a_sweep_on_processes_equals_the_serial_sweep() -> None:
    spec = FleetSpec(block_size=BS)
    jobs = sweep_jobs()
    serial = run_sweep(TRACE, spec, jobs, executor="serial")
    done: list[int] = []
    par = run_sweep(
        TRACE,
        spec,
        jobs,
        executor="process",
        workers=2,
        done=lambda k, t: done.append(k),  # noqa: ARG005 the done callback's signature
    )
    assert [r.to_json() for r in par] == [r.to_json() for r in serial]
    assert sorted(done) == list(range(1, len(jobs) + 1))
    assert [r.job for r in par] == jobs


def test_the_smallest_fleet_meeting_a_target() -> None:
    spec = FleetSpec(block_size=BS)
    results = run_sweep(TRACE, spec, sweep_jobs(), executor="serial")
    best_rate = max(r.hit_rate or 0 for r in results)
    target = round(best_rate * 0.8, 4)
    ans = smallest_fleet(results, target)
    assert ans.best is not None and (ans.best.hit_rate or 0) >= target
    ok = [r for r in results if (r.hit_rate or 0) >= target]
    assert ans.best.job.total_bytes == min(r.job.total_bytes or 0 for r in ok)
    for name, pick in ans.per_router.items():
        mine = [r for r in ok if r.job.router == name]
        if pick is None:
            assert not mine
        else:
            assert pick.job.total_bytes == min(r.job.total_bytes or 0 for r in mine)
    none = smallest_fleet(results, 1.0)
    assert none.best is None and set(none.per_router) == set(ROUTERS)
    # no TTFT in sequence mode: a TTFT target is met by nothing, never by a default
    assert smallest_fleet(results, None, 1e9).best is None
    with pytest.raises(ValueError, match="target-hit-rate"):
        smallest_fleet(results, 1.5)


def test_a_mooncake_sample_runs_every_router() -> None:
    from blockpool.trace import read_trace

    trace = read_trace(str(HEAD50), 512)
    spec = FleetSpec(block_size=BS)
    for r in ROUTERS:
        res = run_job(trace, spec, FleetJob(2, "2000", 2000, r, "append_all"))
        assert res.prompt_tokens == trace.prompt_tokens
        assert sum(res.routed_requests) == len(trace)


def test_ray_is_not_imported_unless_chosen() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys\n"
        "from app.cli import trace_fleet\nfrom app.trace import fleet_output\n"
        "from blockpool.trace.fleet import FleetJob, FleetSpec, run_sweep\n"
        "from tests.trace.fleet_traces import conversation_trace\n"
        "t = conversation_trace(conversations=4, one_offs=2)\n"
        "jobs = [FleetJob(2, '40', 40, 'prefix_aware', 'append_all')]\n"
        "assert run_sweep(t, FleetSpec(), jobs, executor='serial')[0].prompt_tokens\n"
        "print('ray' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
