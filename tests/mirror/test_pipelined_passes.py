"""A pipelined engine's forward passes (vLLM's ``AsyncScheduler``): step
N+1 is scheduled while step N's forward pass runs, then the engine waits for
N.  What it waits for began on the GPU when the last wait ended, so each
wait is a forward pass less the scheduling in between, and varies with what
was scheduled; the plugin's thread plans a pass to end a forward pass after
the last one ended (blockpool_vllm/forward_pass.py).  On a clock the test
moves: the engine's hooks at the moments such an engine calls them.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque

from blockpool.mirror.digest import pool_digest
from blockpool.mirror.protocol import Batch, Digest
from blockpool_vllm.forward_pass import END_SHARE, GAPS_KEPT, KEPT, MIN_WINDOW_NS, ForwardPasses
from tests.mirror.conftest import PassClock
from tests.mirror.workload import FollowedEngine
from tests.support.wait import eventually

MS = 1_000_000
FORWARD_NS = 20 * MS  # the GPU's forward pass, every step


def engine_passes(pipelined: bool = True) -> ForwardPasses:
    p = ForwardPasses(True, pipelined=pipelined)
    p.last_flush = math.inf  # (the engine flushes all the time: never idle)
    return p


def pipelined_steps(p: ForwardPasses, clock: PassClock, scheduling_ns: list[int]) -> None:
    """Steps of a GPU-bound pipelined engine: each scheduled for so long after
    the last wait ended (its pass handed over), then waiting for the step
    before until its forward pass, begun when the last wait ended, is done --
    at once when the scheduling outlasted it (the result was there)."""
    for s in scheduling_ns:
        ended = clock.ns
        clock.ns = ended + s
        p.begins()
        clock.ns = max(clock.ns, ended + FORWARD_NS)
        p.ends()


def test_a_pipelined_pass_is_planned_to_end_a_forward_pass_after_the_last_ended(
    pass_clock: PassClock,
) -> None:
    clock = pass_clock
    p = engine_passes()
    # scheduling 2-18 ms a step: waits of 18 down to 2 ms, one of them 19.5 ms
    # (a long prefill: a wait of 0.5 ms, its result there all but at once)
    varied = [2 * MS, 9 * MS, 18 * MS, 5 * MS, 19_500_000, 7 * MS, 12 * MS, 3 * MS]
    pipelined_steps(p, clock, varied * 3)
    assert not p.windowless()
    assert min(p.lengths) < MIN_WINDOW_NS  # the shortest wait: no time to plan by
    assert p.gaps_seen >= GAPS_KEPT and min(p.gaps) == FORWARD_NS
    for s in (2 * MS, 9 * MS, 15 * MS):
        ended = clock.ns
        clock.ns = ended + s
        p.begins()
        p.plan()
        # END_SHARE of what is left of the forward pass begun when the last wait ended
        assert p.deadline == clock.ns + int((FORWARD_NS - s) * END_SHARE)
        assert p.deadline < ended + FORWARD_NS  # before the engine is back
        assert p.pace.until_ns == p.deadline and p.may_work()
        clock.ns = ended + FORWARD_NS
        p.ends()
        assert p.pace.until_ns == 0


def test_after_a_wait_for_nothing_the_next_pass_is_planned_by_the_shortest_wait(
    pass_clock: PassClock,
) -> None:
    clock = pass_clock
    p = engine_passes()
    pipelined_steps(p, clock, [8 * MS] * (KEPT + 1) + [19_500_000])
    assert not p.ended_waited  # its result was there before: when, is not known
    ended = clock.ns
    clock.ns = ended + 4 * MS
    p.begins()
    p.plan()
    assert p.deadline == clock.ns + int(min(p.lengths) * END_SHARE)
    assert p.deadline - clock.ns < MS
    clock.ns = ended + FORWARD_NS
    p.ends()  # waited for (16 ms): the next is planned by the forward passes again
    ended = clock.ns
    clock.ns = ended + 4 * MS
    p.begins()
    p.plan()
    assert p.deadline == clock.ns + int(16 * MS * END_SHARE)


def test_a_step_scheduled_for_longer_than_a_pass_has_no_time_left(pass_clock: PassClock) -> None:
    clock = pass_clock
    p = engine_passes()
    pipelined_steps(p, clock, [6 * MS] * (KEPT + 1))
    ended = clock.ns
    clock.ns = ended + 21 * MS  # scheduled past the forward pass's end
    p.begins()
    p.plan()
    assert p.deadline == clock.ns  # planned: nothing more begun
    assert p.overdue()


def test_a_pipelined_engine_is_windowless_when_most_of_its_waits_are_too_short(
    pass_clock: PassClock,
) -> None:
    clock = pass_clock
    p = engine_passes()
    # a CPU slower than its GPU: scheduling outlasts every forward pass
    pipelined_steps(p, clock, [25 * MS] * (KEPT + 1))
    assert p.long_ones == 0 and p.windowless()
    p.begins()
    assert p.forwarding and not p.may_work()
    p.ends()
    # a few short waits among the last KEPT: still passes to work in
    pipelined_steps(p, clock, [8 * MS] * (KEPT - KEPT // 2) + [25 * MS] * (KEPT // 2 - 1))
    assert p.long_ones == KEPT - KEPT // 2 and not p.windowless()
    pipelined_steps(p, clock, [25 * MS] * 2)  # (the first pushes out an older short one)
    assert p.long_ones == KEPT // 2 - 1 and p.windowless()


def test_a_synchronous_engine_is_planned_by_its_shortest_pass(pass_clock: PassClock) -> None:
    clock = pass_clock
    # vLLM's Scheduler: the step handed over is the one waited for
    p = engine_passes(pipelined=False)
    lengths = [12 * MS, 6 * MS, 9 * MS] * 6
    for n in lengths:
        clock.ns += 3 * MS
        p.begins()
        clock.ns += n
        p.ends()
    assert p.gaps_seen == 0
    clock.ns += 3 * MS
    p.begins()
    p.plan()
    assert p.deadline == clock.ns + int(6 * MS * END_SHARE)
    # one pass under a millisecond among the last KEPT: windowless
    p.ends()
    clock.ns += MS // 2
    p.begins()
    clock.ns += MS // 2
    p.ends()
    assert p.windowless()


def test_a_threaded_pipelined_engine_is_read_in_its_passes_and_every_digest_is_its_pool() -> None:
    """The engine on its thread, pipelined as vLLM's AsyncScheduler over a
    GPU: each step it schedules (a few pool calls, then a stand-in for the
    scheduler's time: 2 ms, every sixth step 25 ms -- a long prefill,
    longer than the 15 ms forward pass), hands the step to the GPU and waits
    for the step before.  Every sixth wait is thus for nothing: planned by
    its shortest waits the plugin's thread found no pass to work in and read
    only once the engine idled; planned by the passes' ends it reads in the
    passes, and every digest it takes is the pool's at the boundary it
    names."""
    forward_s = 0.015
    offered: queue.SimpleQueue[Batch] = queue.SimpleQueue()

    def offer(b: Batch) -> bool:
        offered.put(b)
        return True

    engine = FollowedEngine(
        num_blocks=256, defer_digest=True, windowed=True, pipelined=True, send=offer
    )
    f = engine.follower
    p = f.passes
    truth: dict[int, str] = {}
    stop = threading.Event()
    in_passes: dict[int, Digest] = {}  # taken on a turn begun in a forward pass
    idle: dict[int, Digest] = {}

    def sender() -> None:  # as the plugin's sender thread: a turn, its batches, the digest
        while not stop.is_set():
            free = p.wait_turn(0.1, queued=not offered.empty())
            in_pass = p.forwarding
            while not offered.empty():
                f.prepare(offered.get())
            if free and f.catch_up() and f.reader.verified is not None:
                d = f.reader.verified
                (in_passes if in_pass else idle)[d.ops] = d

    t = threading.Thread(target=sender)
    t.start()
    inflight: deque[float] = deque()
    gpu_free = 0.0
    try:
        for i in range(180):
            p.ends()  # (the scheduler's hooks: back from the wait)
            engine.step()
            truth[f.op_count] = pool_digest(engine.rt.pool)  # the engine's own, at each boundary
            time.sleep(0.025 if i % 6 == 5 else 0.002)
            gpu_free = max(time.perf_counter(), gpu_free) + forward_s
            inflight.append(gpu_free)
            p.begins()  # the step handed to the GPU
            if len(inflight) >= 2:
                time.sleep(max(0.0, inflight.popleft() - time.perf_counter()))
        p.ends()
    finally:
        stop.set()
        t.join()
    assert not p.windowless() and p.gaps_seen >= GAPS_KEPT
    assert len(in_passes) >= 10, (len(in_passes), len(idle), p.wakes)
    for d in (*in_passes.values(), *idle.values()):
        assert truth[d.ops] == d.value
    while not offered.empty():
        f.prepare(offered.get())
    eventually(f.catch_up, what="the digest caught up once the engine idles")
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()
