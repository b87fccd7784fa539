"""The digest taken off the engine's thread (the plugin's default).

With ``defer_digest`` the engine's thread only hands each flushed step's
block ids over; ``catch_up`` (the sender's thread) reads the pool while the
engine is between batches, throws the reading away when a pool call ran
meanwhile, and the digest rides on a later batch (or a beat) for the
boundary it was taken at.  The mirror keeps its own digest per batch
boundary and checks the engine's against the one of the same boundary.
"""

from __future__ import annotations

import queue
import sys
import threading

import pytest

from blockpool.mirror.apply import Divergence
from blockpool.mirror.digest import Interrupted, pool_digest
from blockpool.mirror.protocol import Batch, Digest
from blockpool.runtime.ops import AllocateOp, FreeOp
from tests.mirror.test_apply import assert_same, mirror_of, wire
from tests.mirror.workload import FollowedEngine

ORDERS = ["append_all", "uncached_first"]


@pytest.mark.parametrize("free_order", ORDERS)
def test_deferred_digests_ride_later_batches_and_the_mirror_checks_each(free_order: str) -> None:
    engine = FollowedEngine(free_order=free_order, defer_digest=True)
    f = engine.follower
    taken: dict[int, str] = {}
    for i in range(240):
        engine.step()
        if i % 3 != 2 and f.reader.pending:  # the sender's thread comes between some steps only
            assert f.catch_up()
            taken[f.digest_ops] = pool_digest(engine.rt.pool)
            assert f.digest.value == taken[f.digest_ops]
            assert not f.reader.pending
    carried = [(b, b.digest) for b in engine.batches if b.digest is not None]
    assert len(carried) >= 100
    for b, d in carried:
        assert d is not None and taken[d.ops] == d.value
        assert d.ops <= b.first_op  # of a boundary before the batch's own operations
    rt, applier = mirror_of(engine)
    applier.synced = True
    checked = sum(
        rt.run(lambda b=b: applier.apply_batch(wire(b))).digest_checked for b in engine.batches
    )
    assert checked == len(carried)  # every one found its boundary on the mirror, and agreed
    assert_same(engine, rt)
    engine.rt.check()


def test_no_digest_is_taken_mid_step() -> None:
    engine = FollowedEngine(defer_digest=True)
    f = engine.follower
    engine.drive(20)
    assert f.catch_up() or not f.reader.pending
    before, ops = f.digest.value, f.digest_ops
    got = engine.rt.apply(AllocateOp(num_blocks=2))  # a pool call of a step not flushed yet
    engine.follower.flush()
    engine.rt.apply(FreeOp(block_ids=got["block_ids"][:1]))  # ... and one after the flush
    assert f.op_count > f.flushed_ops
    assert not f.catch_up()  # the engine is mid-step: nothing read, nothing changed
    assert (f.digest.value, f.digest_ops) == (before, ops)
    f.flush()
    assert f.catch_up()
    assert f.digest.value == pool_digest(engine.rt.pool) and f.digest_ops == f.op_count
    engine.rt.check()


def test_a_reading_the_engine_interrupted_is_thrown_away() -> None:
    engine = FollowedEngine(defer_digest=True)
    f = engine.follower
    engine.drive(20)
    f.catch_up()
    before = f.digest.value
    engine.rt.apply(AllocateOp(num_blocks=3))
    f.flush()
    stage = f.digest.stage

    def interrupted(ids: object, *args: object, **kw: object) -> object:
        out = stage(ids, *args, **kw)  # type: ignore[arg-type]
        engine.rt.apply(AllocateOp(num_blocks=1))  # the engine ran a pool call meanwhile
        return out

    f.digest.stage = interrupted  # type: ignore[method-assign]
    assert not f.catch_up()
    assert f.reader.digests_discarded == 1 and f.reader.verified is None
    assert f.digest.value == before
    f.digest.stage = stage  # type: ignore[method-assign]
    f.flush()
    assert f.catch_up()
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_the_mirror_checks_a_digest_by_its_boundary_and_refuses_a_wrong_one() -> None:
    engine = FollowedEngine(defer_digest=True)
    engine.drive(30)
    rt, applier = mirror_of(engine)
    applier.synced = True
    ends: dict[int, str] = {}
    for b in engine.batches:
        rt.run(lambda b=b: applier.apply_batch(wire(b)))
        ends[applier.next_op] = pool_digest(rt.pool)
    old = sorted(ends)[len(ends) // 2]
    assert applier.check_digest(Digest(old, ends[old]))  # an earlier boundary, kept
    assert not applier.check_digest(Digest(old + 10_000, "0" * 16))  # no such boundary here
    with pytest.raises(Divergence, match="digest"):
        applier.check_digest(Digest(old, "0" * 16))
    rt.check()


def test_a_snapshot_starts_between_steps_with_the_digest_of_its_moment() -> None:
    engine = FollowedEngine(num_blocks=96, defer_digest=True)
    f = engine.follower
    engine.drive(40)
    f.passes.last_flush = 0.0  # the engine idle: the sender's thread copies
    snap = None
    for _ in range(1000):
        snap = f.poll_snapshot()
        if snap is not None:
            break
    assert snap is not None
    assert snap.ops == f.op_count and snap.digest == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_threaded_engine_and_sender_agree_on_every_digest_taken() -> None:
    """The engine steps on its thread; the sender's thread prepares the
    batches offered and catches up as often as it gets the interpreter
    (switching forced very often), as the plugin's does: every digest it
    takes is the pool's at the boundary it names."""
    offered: queue.SimpleQueue[Batch] = queue.SimpleQueue()

    def offer(b: Batch) -> bool:
        offered.put(b)
        return True

    engine = FollowedEngine(num_blocks=48, defer_digest=True, send=offer)
    f = engine.follower
    truth: dict[int, str] = {}
    stop = threading.Event()
    taken: list[Digest] = []

    caught = threading.Event()

    def sender() -> None:
        while not stop.is_set():
            while not offered.empty():
                f.prepare(offered.get())
            if f.catch_up() and f.reader.verified is not None:
                taken.append(f.reader.verified)
                caught.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=sender)
    t.start()
    try:
        for i in range(400):
            engine.step()
            truth[f.op_count] = pool_digest(engine.rt.pool)  # the engine's own, at each boundary
            if i % 10 == 9:  # a forward pass: the engine waits for the sender
                caught.clear()
                if f.reader.pending or f.inflight:
                    assert caught.wait(60)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert len(taken) >= 30
    for d in taken:
        assert truth[d.ops] == d.value
    while not offered.empty():
        f.prepare(offered.get())
    f.flush()
    f.catch_up()
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_reading_stops_when_its_pause_says_the_engine_moved() -> None:
    engine = FollowedEngine(num_blocks=1024, defer_digest=True)
    f = engine.follower
    got = engine.rt.apply(AllocateOp(num_blocks=600))
    f.flush()
    ids = [i for part in f.reader.pending for i in part]
    assert len(ids) >= 600
    before = f.digest.value
    calls: list[int] = []

    def pause() -> bool:
        calls.append(1)
        return len(calls) < 2  # the second pause finds the engine moved

    with pytest.raises(Interrupted):
        f.digest.stage(ids, pause)
    assert len(calls) == 2 and f.digest.value == before  # nothing taken
    assert f.catch_up() and f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.apply(FreeOp(block_ids=got["block_ids"]))
    engine.rt.check()


def test_a_dropped_batch_names_no_block_to_a_reading_in_progress() -> None:
    """A batch the sender's queue refused is never prepared: its blocks
    are not handed to the reader from the engine's thread -- a reading
    checked before the batch's calls and done with after them cleared the
    very blocks those calls changed, and the next digest missed them -- but
    the digest is rebuilt whole, on the reader's thread."""
    engine = FollowedEngine(defer_digest=True)
    f = engine.follower
    engine.drive(20)
    f.catch_up()
    got = engine.rt.apply(AllocateOp(num_blocks=2))
    f.flush()
    assert set(got["block_ids"]) <= {i for part in f.reader.pending for i in part}
    commit = f.digest.commit

    def then_the_engine_steps(staged: object) -> None:  # read, checked; not yet done with
        commit(staged)  # type: ignore[arg-type]
        engine.rt.apply(FreeOp(block_ids=got["block_ids"]))  # the blocks being read, changed
        engine.accept = False
        f.flush()  # ... and their batch dropped
        engine.accept = True

    f.digest.commit = then_the_engine_steps  # type: ignore[method-assign]
    assert f.catch_up()  # the reading was of the boundary before the free: kept
    f.digest.commit = commit  # type: ignore[method-assign]
    assert f.drops == 1
    engine.rt.apply(AllocateOp(num_blocks=1))
    f.flush()
    for _ in range(1000):  # the sweep, in pieces
        if f.catch_up():
            break
    assert f.digest_ops == f.op_count and f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()
