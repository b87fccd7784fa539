"""An engine whose forward passes are too short to work in -- vLLM's
``AsyncScheduler`` on a CPU slower than its GPU: the "pass" between two
scheduler calls is the engine's own Python (~0.4 ms measured at GPU scale),
never a wait.  The plugin's thread is not woken for such passes and reads
nothing in them (each would take the interpreter from a busy engine); its
batches still stream, on turns it takes overdue, working longer between two
sleeps (blockpool_vllm/pacing.py); once the engine idles, the digest is read.
"""

from __future__ import annotations

import time

import pytest

from blockpool.mirror.digest import pool_digest
from blockpool_vllm import forward_pass
from blockpool_vllm.forward_pass import KEPT, MIN_WINDOW_NS
from blockpool_vllm.pacing import BUSY_EVERY_NS, EVERY_NS, Pacer
from blockpool_vllm.sender import Sender
from tests.app.conftest import free_port
from tests.mirror.workload import FollowedEngine, passes_of
from tests.support.wait import WAIT_TIMEOUT, eventually

SHORT_NS = 30_000  # a pass of 30 µs


def test_the_pacer_works_longer_between_sleeps_while_the_engine_works() -> None:
    pace = Pacer()
    assert pace.every_ns == EVERY_NS
    pace.busy(True)
    assert pace.every_ns == BUSY_EVERY_NS > EVERY_NS
    pace.busy(False)
    assert pace.every_ns == EVERY_NS
    custom = Pacer(every_ns=7, busy_every_ns=70)
    custom.busy(True)
    assert custom.every_ns == 70
    custom.busy(False)
    assert custom.every_ns == 7


def test_a_pass_too_short_is_no_turn_and_nothing_is_read_in_it() -> None:
    engine = FollowedEngine(num_blocks=512, defer_digest=True, windowed=True)
    f = engine.follower
    engine.drive(6)  # batches pending
    pending = [list(p) for p in f.reader.pending]
    assert pending
    passes_of(engine, [SHORT_NS] * (KEPT + 1))
    assert f.passes.windowless()
    f.passes.begins()  # a pass begins: too short to work in, as the last ones
    assert f.passes.forwarding and not f.passes.may_work()
    assert not f.passes.wait_turn(0.01)  # (not woken for it: its timeout, then no turn)
    assert f.passes.pace.every_ns == BUSY_EVERY_NS  # a turn taken anyway works longer
    assert not f.catch_up()
    assert [list(p) for p in f.reader.pending] == pending  # nothing read, nothing begun
    assert f.reader.digests_discarded == 0 and f.reader.digests_taken == 0
    f.passes.ends()
    # passes long enough again (the last KEPT): a pass is a turn, read in
    passes_of(engine, [MIN_WINDOW_NS * 50] * KEPT)
    assert not f.passes.windowless()
    f.passes.begins()
    f.passes.began -= MIN_WINDOW_NS
    assert f.passes.wait_turn(0.01) and f.passes.pace.every_ns == EVERY_NS
    assert f.catch_up() and not f.reader.pending
    assert f.digest.value == pool_digest(engine.rt.pool)
    f.passes.ends()
    engine.rt.check()


def test_passes_of_a_millisecond_or_more_are_turns() -> None:
    engine = FollowedEngine(num_blocks=64, defer_digest=True, windowed=True)
    p = engine.follower.passes
    passes_of(engine, [MIN_WINDOW_NS] * (KEPT + 1))
    assert not p.windowless()
    passes_of(engine, [MIN_WINDOW_NS // 2])  # one shorter among the last KEPT
    assert p.windowless()
    engine.rt.check()


def test_an_engine_with_passes_too_short_still_streams_and_reads_once_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the engine never idles while the steps below run (however slow this machine)
    monkeypatch.setattr(forward_pass, "IDLE_AFTER_S", 3600.0)
    engine = FollowedEngine(num_blocks=512, defer_digest=True, windowed=True)
    f = engine.follower
    passes_of(engine, [SHORT_NS] * (KEPT + 1))
    sender = Sender(
        f"tcp://127.0.0.1:{free_port()}",
        engine.hello,
        f.poll_snapshot,
        engine.stats,
        background=f.catch_up,
        prepare=f.prepare,
        turn=f.passes.wait_turn,
        pace=f.passes.pace,
        control_endpoint=f"tcp://127.0.0.1:{free_port()}",
        retry_s=0.05,
    )
    engine.send = sender.offer
    try:
        assert sender.start()
        # steps with passes of 30 µs, until more batches went out than queue
        # before an overdue turn (64): the stream flows with no pass to work in
        deadline = time.monotonic() + WAIT_TIMEOUT
        while sender.sent < 100:
            assert time.monotonic() < deadline, f"sent {sender.sent} of {f.seq}"
            f.passes.begins()
            engine.step()  # (the step's pool calls and its flush: a batch)
            f.passes.began -= SHORT_NS
            f.passes.ends()
        assert sender.dropped == 0 and f.drops == 0
        assert f.reader.digests_taken == 0 and f.reader.digests_discarded == 0
        assert f.passes.pace.every_ns == BUSY_EVERY_NS
        # the engine idles: the rest of the stream, and the digest read
        monkeypatch.setattr(forward_pass, "IDLE_AFTER_S", 0.05)
        eventually(lambda: sender.sent == f.seq, what="every batch sent")
        eventually(lambda: f.reader.digests_taken > 0, what="a digest taken once idle")
        assert f.digest.value == pool_digest(engine.rt.pool)
    finally:
        sender.close()
    engine.rt.check()
