"""The plugin's thread is woken for the engine's forward passes only as often
as it needs (blockpool_vllm/forward_pass.py, ``WAKE_EVERY_NS``): at most
every so often while it has nothing left over from its last turn, at every
pass while it has (batches queued, the digest behind, a snapshot) -- each
wake costs the engine more than the work done in it."""

from __future__ import annotations

import threading

from blockpool.mirror.digest import pool_digest
from blockpool.runtime.ops import AllocateOp
from blockpool_vllm.forward_pass import WAKE_EVERY_NS
from tests.mirror.workload import FollowedEngine
from tests.support.wait import eventually


def one_pass(engine: FollowedEngine) -> None:
    engine.follower.passes.begins()
    engine.follower.passes.ends()


def after_a_pass() -> FollowedEngine:
    """An engine followed as the plugin does, one forward pass made (its
    thread woken for it: the first)."""
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    one_pass(engine)
    return engine


def test_woken_at_most_every_so_often_while_nothing_is_left_over() -> None:
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    p = engine.follower.passes
    one_pass(engine)  # the first pass: woken (never before)
    assert (p.count, p.wakes) == (1, 1)
    for _ in range(9):  # passes soon after it, nothing left to do: not woken
        one_pass(engine)
    assert (p.count, p.wakes) == (10, 1)
    p.woken_at -= WAKE_EVERY_NS  # (the last wake that long ago)
    one_pass(engine)
    assert (p.count, p.wakes) == (11, 2)
    one_pass(engine)
    assert (p.count, p.wakes) == (12, 2)
    # batches left queued when the thread went to wait: woken at the next pass
    p.wait_turn(0.0, queued=True)
    assert p.eager
    one_pass(engine)
    assert (p.count, p.wakes) == (13, 3)
    p.wait_turn(0.0)  # nothing left: not eager any more
    assert not p.eager
    one_pass(engine)
    assert (p.count, p.wakes) == (14, 3)
    engine.rt.check()


def test_woken_at_every_pass_while_the_digest_is_behind_then_not() -> None:
    engine = after_a_pass()
    f, p = engine.follower, engine.follower.passes
    p.wait_turn(0.0)  # that pass's turn taken, nothing left: not eager
    assert not p.eager
    engine.rt.apply(AllocateOp(num_blocks=300))
    f.flush()  # a batch prepared (FollowedEngine): its blocks pending for the digest
    assert f.reader.due
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(p.wait_turn(60.0)))
    waiter.start()
    eventually(lambda: p.eager, what="the waiting thread eager: its digest is behind")
    p.begins()  # the next pass, soon after the last wake: woken all the same
    waiter.join(60)
    assert woke == [True] and p.wakes == 2
    assert f.catch_up()  # read in that pass
    assert not f.reader.due and f.digest.value == pool_digest(engine.rt.pool)
    p.ends()
    p.wait_turn(0.0)  # caught up: not eager
    assert not p.eager
    one_pass(engine)
    assert p.wakes == 2
    engine.rt.check()


def test_a_snapshot_asked_for_makes_the_thread_eager() -> None:
    engine = after_a_pass()
    f, p = engine.follower, engine.follower.passes
    f.want_snapshot = True  # (what a mirror's request sets, blockpool_vllm/follower.py)
    p.wait_turn(0.0)
    assert p.eager
    one_pass(engine)
    assert p.wakes == 2
    engine.rt.check()
