"""The digest taken off the engine's thread (the plugin's default).

With ``defer_digest`` the engine's thread only hands each flushed step's
block ids over; ``catch_up`` (the sender's thread) reads the pool while the
engine is between batches, throws the reading away when a pool call ran
meanwhile, and the digest rides on a later batch (or a beat) for the
boundary it was taken at.  The mirror keeps its own digest per batch
boundary and checks the engine's against the one of the same boundary.
"""

from __future__ import annotations

import random
import sys
import threading
from typing import Any

import pytest

from blockpool.mirror.apply import Divergence
from blockpool.mirror.digest import Interrupted, pool_digest
from blockpool.mirror.protocol import Digest
from blockpool.runtime.ops import AllocateOp, FreeOp
from blockpool_vllm import digest_reader, forward_pass
from blockpool_vllm.digest_reader import MAX_BEHIND, MIN_BEHIND_ROWS, MIN_PIECE
from blockpool_vllm.forward_pass import KEPT
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
    """The engine steps on its thread; the sender's thread catches up as
    often as it gets the interpreter (switching forced very often): every
    digest it takes is the pool's at the boundary it names."""
    engine = FollowedEngine(num_blocks=48, defer_digest=True)
    f = engine.follower
    truth: dict[int, str] = {}
    stop = threading.Event()
    taken: list[Digest] = []

    caught = threading.Event()

    def sender() -> None:
        while not stop.is_set():
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
                if f.reader.pending:
                    assert caught.wait(60)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert len(taken) >= 30
    for d in taken:
        assert truth[d.ops] == d.value
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


def test_a_sender_that_falls_behind_reads_the_backlog_a_batch_at_a_time_and_keeps_each() -> None:
    engine = FollowedEngine(defer_digest=True)
    f = engine.follower
    ops_before = f.digest_ops
    for _ in range(120):  # no catch_up at all: the sender's thread starved
        engine.step()
    # a backlog smaller than the pool: no sweep
    assert not f.reader.sweep_due and f.reader.sweep is None
    assert f.digests_on_engine == 0 and f.digest_ops == ops_before  # ... nothing read here
    parts = len(f.reader.pending)
    assert parts > MAX_BEHIND
    # the engine comes back after the sender's first batch: that batch's reading is kept
    may_work = f.passes.may_work

    def back_after_the_first_batch() -> bool:
        return len(f.reader.pending) == parts  # back once the first batch's reading is kept

    f.passes.may_work = back_after_the_first_batch  # type: ignore[method-assign]
    assert not f.catch_up()
    assert len(f.reader.pending) == parts - 1 and f.reader.verified is None
    assert f.reader.digests_discarded == 0
    f.passes.may_work = may_work  # type: ignore[method-assign]
    engine.drive(5)  # the engine moved on meanwhile: its blocks join the backlog
    assert f.catch_up()  # the rest, at one moment: the digest is the pool's now
    assert f.reader.sweeps == 0 and not f.reader.pending
    assert f.reader.verified is not None and f.reader.verified.ops == f.op_count
    assert f.digest.value == f.reader.verified.value == pool_digest(engine.rt.pool)
    engine.drive(20)  # and the usual catching up from there on
    assert f.catch_up() and f.digest.value == pool_digest(engine.rt.pool)
    engine.drive(3)
    batch = f.flush(force_digest=True)  # a digest asked for now: read here, counted
    assert f.digests_on_engine == 1 and batch is not None and batch.digest is not None
    assert batch.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_backlog_beyond_a_share_of_the_pool_is_swept_instead_never_on_the_engine() -> None:
    # (a pool larger than the blocks 120 steps name: each waits once, however
    # often named -- a small one's blocks would all be waiting after a few)
    engine = FollowedEngine(num_blocks=1024, defer_digest=True)
    f = engine.follower
    assert f.reader.max_behind_rows == MIN_BEHIND_ROWS  # a small pool: the floor
    f.reader.max_behind_rows = 200  # (as a GPU pool's quarter is to its steps)
    ops_before = f.digest_ops
    for _ in range(120):
        engine.step()
    assert f.reader.sweep_due and f.reader.sweep is None  # asked of the sender's thread ...
    assert f.digests_on_engine == 0 and f.digest_ops == ops_before  # ... nothing read here
    pending = f.reader.pending
    assert sum(map(len, pending)) <= 200 + max(map(len, pending))  # bounded meanwhile
    assert f.catch_up()  # one long moment here: the whole sweep
    assert f.reader.sweeps == 1 and not f.reader.sweep_due
    assert f.reader.sweep is None and not f.reader.pending
    assert f.reader.verified is not None and f.reader.verified.ops == f.op_count
    assert f.digest.value == f.reader.verified.value == pool_digest(engine.rt.pool)
    engine.drive(5)
    assert f.catch_up() and f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_the_sender_begins_no_batch_it_cannot_read_before_the_engine_is_back() -> None:
    engine = FollowedEngine(defer_digest=True, windowed=True)
    f = engine.follower
    for _ in range(KEPT):  # forward passes of about 50 ms, as the engine's hooks say
        f.passes.begins()
        f.passes.began -= 50_000_000
        f.passes.ends()
    assert min(f.passes.lengths) >= 50_000_000
    engine.drive(6)  # three batches pending
    parts = len(f.reader.pending)
    assert parts >= 3
    f.passes.begins()
    f.passes.plan()  # (what wait_turn does once woken)
    assert f.passes.deadline > f.passes.began
    f.passes.began -= 49_000_000  # most of the pass gone: time for one batch, not more
    f.passes.plan()
    f.reader.read_ns_per_block = 1e9  # (a reading as slow as this would never end in time)
    assert not f.catch_up()
    assert len(f.reader.pending) == parts - 1  # the first, always
    assert f.reader.digests_discarded == 0
    f.passes.ends()
    f.passes.begins()  # the next pass: planned afresh, time for all
    f.passes.plan()
    f.reader.read_ns_per_block = 1_000.0
    assert f.catch_up() and not f.reader.pending
    assert f.digest.value == pool_digest(engine.rt.pool)
    f.passes.ends()
    f.passes.last_flush = 0.0  # an idle engine: no plan, no deadline
    f.passes.plan()
    assert f.passes.deadline == 0
    engine.rt.check()


def test_the_sender_reads_in_the_engines_forward_pass_and_lets_go_when_it_ends() -> None:
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    f = engine.follower
    engine.rt.apply(AllocateOp(num_blocks=600))
    f.flush()  # the engine is busy (it just flushed), not in a forward pass
    before = f.digest.value
    assert not f.passes.may_work() and not f.passes.wait_turn(0.01)
    assert not f.catch_up()  # nothing read while the engine works: not even begun
    assert f.reader.digests_discarded == 0 and f.digest.value == before and f.reader.pending

    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(f.passes.wait_turn(60.0)))
    t.start()
    f.passes.begins()  # the scheduler handed the step to the model
    t.join(60)
    assert woke == [True]  # the waiting sender woke for it
    assert f.catch_up() and f.digest.value == pool_digest(engine.rt.pool)

    f.passes.ends()  # the engine's thread is back in the scheduler
    assert not f.passes.may_work() and not f.passes.wait_turn(0.01)  # (no new forward pass)
    f.passes.last_flush = 0.0  # ... and once it has been idle a while, the sender may work
    assert f.passes.may_work() and f.passes.wait_turn(0.01)
    engine.rt.check()


def cut_into_pieces(pending: list[Any], rng: random.Random) -> None:
    """Each pending batch's blocks cut at random places (what a pass too
    short for a batch does, ``MIN_PIECE``): a piece for each."""
    pieces = []
    for part in pending:
        cuts = sorted({rng.randrange(len(part) + 1) for _ in range(rng.randrange(3))})
        at = 0
        for c in [*cuts, len(part)]:
            if c > at:
                pieces.append(part[at:c])
                at = c
    pending[:] = pieces


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("free_order", ORDERS)
@pytest.mark.parametrize("pieces", [False, True])
def test_backlogs_read_in_parts_cut_anywhere_always_end_at_the_pools_digest(
    seed: int, free_order: str, pieces: bool
) -> None:
    """A sender that falls behind by a random number of batches and whose
    moments end after a random number of them (with ``pieces``, each batch
    also cut into pieces read at moments of their own): every digest it
    takes is the pool's (the parts read at earlier moments kept, none of
    their neighbours' old links lost)."""
    rng = random.Random(seed + (1000 if pieces else 0))
    engine = FollowedEngine(num_blocks=48, free_order=free_order, defer_digest=True)
    f = engine.follower
    may_work = f.passes.may_work
    taken = 0
    for _ in range(60):
        engine.drive(rng.randrange(1, 8))
        if pieces:
            cut_into_pieces(f.reader.pending, rng)
        left = rng.choice([0, 1, 2, 5, 10_000])
        parts = len(f.reader.pending)

        def cut(parts: int = parts, left: int = left) -> bool:
            return parts - len(f.reader.pending) <= left  # back after ``left`` + 1 batches

        f.passes.may_work = cut  # type: ignore[method-assign]
        done = f.catch_up()
        f.passes.may_work = may_work  # type: ignore[method-assign]
        if done:
            taken += 1
            assert f.reader.verified is not None and f.reader.verified.ops == f.op_count
            assert f.digest.value == f.reader.verified.value == pool_digest(engine.rt.pool)
        elif parts:
            assert parts - len(f.reader.pending) == left + 1  # those read are kept
    assert f.reader.sweeps == 0 and f.reader.digests_discarded == 0
    assert taken >= 5
    assert f.catch_up() or not f.reader.pending
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_batch_longer_than_a_pass_is_read_in_pieces_that_fit_each_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch whose blocks take longer to read than any forward pass
    leaves (a large prefill, many requests finishing at once) is read in
    pieces: at each pass as many of its blocks as fit before the plan's
    deadline (at least ``MIN_PIECE``), each piece kept, none thrown away;
    once the last piece is read the digest is the pool's -- where reading
    whole batches only would start that batch again at every pass, never
    finish it, and fall behind for good."""
    clock = [10**12]  # reading a named block takes 1 ms
    monkeypatch.setattr(forward_pass, "_now", lambda: clock[0])
    monkeypatch.setattr(digest_reader, "_now", lambda: clock[0])
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    f = engine.follower
    stage = f.digest.stage

    def timed(ids: Any, pause: Any = None) -> Any:
        clock[0] += 1_000_000 * len(ids)
        return stage(ids, pause)

    f.digest.stage = timed  # type: ignore[method-assign]
    for _ in range(KEPT):  # forward passes of 100 ms: 85 blocks' time planned
        f.passes.begins()
        f.passes.began -= 100_000_000
        f.passes.ends()
    f.reader.read_ns_per_block = 1_000_000.0  # (as measured)
    engine.rt.apply(AllocateOp(num_blocks=300))  # one step naming 300 blocks
    f.flush()
    assert [len(p) for p in f.reader.pending] == [300]
    for left in (215, 130):
        f.passes.begins()
        f.passes.plan()
        assert not f.catch_up()
        assert [len(p) for p in f.reader.pending] == [left]  # 85 blocks read, kept
        clock[0] = f.passes.began + 100_000_000
        f.passes.ends()
    assert f.reader.digests_discarded == 0 and f.reader.verified is None
    f.passes.begins()
    f.passes.plan()
    f.passes.began -= 99_000_000  # 1 ms left: the first piece is read all the same
    f.passes.plan()
    assert not f.catch_up()
    assert [len(p) for p in f.reader.pending] == [130 - MIN_PIECE]
    f.passes.ends()
    f.passes.begins()
    f.passes.plan()
    assert f.catch_up() and not f.reader.pending
    assert f.reader.verified is not None and f.reader.verified.ops == f.op_count
    assert f.digest.value == f.reader.verified.value == pool_digest(engine.rt.pool)
    assert f.reader.digests_discarded == 0 and f.reader.sweeps == 0
    engine.rt.check()


def test_a_planned_pass_reads_max_piece_blocks_at_once_an_interrupted_piece_loses_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(digest_reader, "MAX_PIECE", 100)
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    f = engine.follower
    for _ in range(KEPT):  # forward passes of 10 s: time for every block
        f.passes.begins()
        f.passes.began -= 10_000_000_000
        f.passes.ends()
    engine.rt.apply(AllocateOp(num_blocks=300))
    f.flush()
    assert [len(p) for p in f.reader.pending] == [300]
    f.passes.begins()
    f.passes.plan()
    staged: list[int] = []
    stage = f.digest.stage

    def counted(ids: Any, pause: Any = None) -> Any:
        staged.append(len(ids))
        return stage(ids, pause)

    f.digest.stage = counted  # type: ignore[method-assign]
    may_work = f.passes.may_work
    f.passes.may_work = lambda: len(staged) < 2  # type: ignore[method-assign]
    assert not f.catch_up()  # the engine back during the second piece
    assert staged == [100, 100] and [len(p) for p in f.reader.pending] == [200]
    assert f.reader.digests_discarded == 1  # that piece thrown away, the first kept
    f.passes.may_work = may_work  # type: ignore[method-assign]
    assert f.catch_up() and not f.reader.pending  # the rest, 100 at a time
    assert staged == [100, 100, 100, 100]
    assert f.reader.verified is not None
    assert f.digest.value == f.reader.verified.value == pool_digest(engine.rt.pool)
    f.passes.ends()
    engine.rt.apply(AllocateOp(num_blocks=300))
    f.flush()
    f.passes.last_flush = 0.0  # an idle engine: no plan, a batch read whole
    f.passes.plan()
    staged.clear()
    assert f.catch_up() and staged == [300]
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()
