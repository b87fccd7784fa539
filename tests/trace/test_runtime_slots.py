"""The scheduler on a PoolRuntime's operations (the live replay's slots)
schedules as it does on KVSlots: the same cached prefix per request, the
same preemptions, the same completion order, the same lookup counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blockpool import BlockPool, check_invariants, init_none_hash, sha256
from blockpool.core.manager import _request_block_hasher
from blockpool.core.request import Request
from blockpool.runtime import PoolRuntime, RuntimeConfig
from blockpool.runtime.ops import FinishOp
from blockpool.trace.sched.runtime_slots import RuntimeSlots, live_request
from blockpool.trace.sched.sched_request import SchedRequest
from blockpool.trace.sched.scheduler import Scheduler, SchedulerConfig
from blockpool.trace.sched.slots import KVSlots
from blockpool.trace.workload.reader import Trace
from tests.trace.sched_traces import write_trace

# the live driver's settings: synchronous, chunks of at most 256 tokens
CFG = SchedulerConfig(1024, 32, True, 256, None, "fcfs", False)


def _drive(sched: Scheduler, reqs: list[SchedRequest], stranger: Any = None) -> list[str]:
    """Arrivals at their times, a step every 20 ms, to the end; the finish order."""
    order: list[str] = []
    clock, i = 0.0, 0
    while i < len(reqs) or sched.has_requests():
        if not sched.has_requests():
            clock = max(clock, reqs[i].arrival_ms)
        while i < len(reqs) and reqs[i].arrival_ms <= clock:
            sched.add(reqs[i])
            i += 1
        plan = sched.schedule(clock)
        order += [r.rid for r in sched.update(plan, clock + 20)]
        if stranger is not None:
            stranger(sched)
        clock += 20
    return order


def _on_pool(trace: Trace, blocks: int) -> tuple[list[Any], list[str], KVSlots]:
    init_none_hash(sha256)
    pool = BlockPool(blocks, True, 16, False)
    slots = KVSlots(pool, 16, CFG.model_len)
    hasher = _request_block_hasher(16, sha256)
    reqs = [
        SchedRequest(
            Request(f"r{tr.index}", trace.prompt_token_ids(tr), block_hasher=hasher),
            trace.output_token_ids(tr) or [0],
            max(tr.output_length, 1),
            tr.timestamp_ms,
            tr.priority,
            tr.index,
        )
        for tr in trace.requests
    ]
    order = _drive(Scheduler(slots, CFG), reqs)
    check_invariants(pool)
    assert pool.get_num_free_blocks() == blocks - 1
    return [(r.num_cached_tokens, r.num_preemptions) for r in reqs], order, slots


def _on_runtime(
    trace: Trace, blocks: int, stranger: Any = None
) -> tuple[list[Any], list[str], RuntimeSlots, PoolRuntime]:
    rt = PoolRuntime(RuntimeConfig(num_blocks=blocks, block_size=16))
    applied: list[Any] = []

    def apply(op: Any) -> dict[str, Any]:
        applied.append(op)
        return rt.apply(op)

    slots = RuntimeSlots(trace, apply, rt.manager)
    reqs = [live_request(trace, tr, f"r{tr.index}", tr.timestamp_ms) for tr in trace.requests]
    order = _drive(Scheduler(slots, CFG), reqs, stranger and (lambda s: stranger(s, rt, slots)))
    rt.check()
    assert rt.manager.requests == {} and slots.held == {}
    assert rt.pool.get_num_free_blocks() == blocks - 1
    # no operation brings in more than a chunk of new tokens
    assert all(len(op.token_ids) <= 256 for op in applied if op.op == "append")
    return [(r.num_cached_tokens, r.num_preemptions) for r in reqs], order, slots, rt


@pytest.mark.parametrize(("seed", "blocks"), [(1, 400), (2, 250), (3, 4000)])
def test_runtime_slots_schedule_as_kv_slots(tmp_path: Path, seed: int, blocks: int) -> None:
    trace = write_trace(tmp_path / "t.jsonl", seed, 80)
    want, want_order, kv = _on_pool(trace, blocks)
    got, got_order, slots, rt = _on_runtime(trace, blocks)
    assert got == want
    assert got_order == want_order and len(got_order) == len(trace)
    assert slots.stats.to_json() == kv.stats.to_json()
    assert rt.counters.requests_admitted == len(trace) + sum(p for _, p in got)
    if blocks < 1000:
        assert sum(p for _, p in got) > 0  # the comparison covers preemption
    assert sum(c for c, _ in got) > 0


def test_a_request_another_client_finishes_is_noted_lost(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 4, 20)
    seen: list[str] = []
    finished: list[str] = []

    def stranger(sched: Scheduler, rt: PoolRuntime, slots: RuntimeSlots) -> None:
        for rid in slots.lost:  # the driver's part: recompute it
            seen.append(rid)
            sched.requeue(sched.requests[rid])
        slots.lost.clear()
        if not finished and sched.running:  # every running request asks for more slots
            finished.append(sched.running[0].rid)
            rt.apply(FinishOp(request_id=finished[0]))

    _, order, _, _ = _on_runtime(trace, 4000, stranger)
    assert seen == finished and sorted(order) == sorted(f"r{i}" for i in range(len(trace)))
