"""The digest's reader when the engine gives it little time (the plugin's
default, ``defer_digest``): a backlog read a batch at a time or swept, each
reading planned to end before the engine's forward pass does, in pieces
that fit, an interrupted piece the only one lost -- and whatever the cut,
the digest at the end is the pool's."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from blockpool.mirror.digest import pool_digest
from blockpool.runtime.ops import AllocateOp
from blockpool_vllm import digest_reader, forward_pass
from blockpool_vllm.digest_reader import MAX_BEHIND, MIN_BEHIND_ROWS, MIN_PIECE
from blockpool_vllm.forward_pass import KEPT
from tests.mirror.workload import FollowedEngine

ORDERS = ["append_all", "uncached_first"]


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
        out = stage(ids, pause)  # (the time charged once it is read: no deadline met inside)
        clock[0] += 1_000_000 * len(ids)
        return out

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
    assert not f.catch_up()  # the engine back during the second piece, before a pool call
    assert staged == [100, 100]
    # the pool stood still: the 64 blocks read before the stop are kept, the
    # 36 left are the first to read next, then the third batch's 100
    assert [len(p) for p in f.reader.pending] == [36, 100]
    assert f.reader.digests_discarded == 0 and f.reader.readings_stopped == 1
    f.passes.may_work = may_work  # type: ignore[method-assign]
    assert f.catch_up() and not f.reader.pending  # the rest, 100 at most at a time
    assert staged == [100, 100, 36, 100]
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
