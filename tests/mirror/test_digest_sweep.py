"""The deferred digest rebuilt in pieces (blockpool/mirror/digest_sweep.py)
while the engine keeps calling its pool between the pieces: every digest a
sweep ends with is the pool's at the moment it names."""

from __future__ import annotations

import random

import pytest

from blockpool.mirror import digest as digest_module
from blockpool.mirror import digest_sweep
from blockpool.mirror.digest import pool_digest
from blockpool.runtime.ops import AllocateOp, CacheOp, FinishOp, FreeOp, ResetOp
from blockpool_vllm import digest_reader, forward_pass
from tests.mirror.workload import FollowedEngine


def duplicate_hashes(engine: FollowedEngine, rng: random.Random) -> list[int]:
    """Two blocks cached under one hash (the map's several-blocks case)."""
    got = engine.rt.apply(AllocateOp(num_blocks=2))["block_ids"]
    tokens = [rng.randrange(50) for _ in range(4)]
    for bid in got:
        engine.rt.apply(CacheOp(block_ids=[bid], token_ids=tokens))
    return list(got)


@pytest.mark.parametrize("seed", range(12))
def test_a_sweep_between_pool_calls_ends_at_the_pools_digest(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digest_sweep, "PIECE", 3)  # many pieces, many moments between
    rng = random.Random(seed)
    engine = FollowedEngine(num_blocks=96, defer_digest=True)
    engine.rng = random.Random(seed)
    f = engine.follower
    engine.drive(10)
    f.reader.sweep_due = True
    held: list[int] = []
    budget = [0]

    def may_work() -> bool:  # the engine comes back after a few pieces
        budget[0] -= 1
        return budget[0] > 0

    monkeypatch.setattr(f.passes, "may_work", may_work)
    taken = 0
    for i in range(400):
        engine.step()
        if i % 7 == 3 and engine.rt.pool.get_num_free_blocks() >= 8:
            held += duplicate_hashes(engine, rng)
            f.flush()
        if held and i % 3 == 1:
            engine.rt.apply(FreeOp(block_ids=[held.pop(0)]))
            f.flush()
        if i % 90 == 60:
            f.reader.sweep_due = True  # as after a reset, or a sender that fell behind
        budget[0] = rng.randrange(2, 7)  # (+1: the first look, whether to begin at all)
        if f.catch_up():
            assert f.reader.verified is not None and f.reader.verified.ops == f.op_count
            assert f.reader.verified.value == f.digest.value == pool_digest(engine.rt.pool)
            taken += 1
    assert f.reader.sweeps >= 2 and taken >= 10
    budget[0] = 10**9
    engine.step()
    f.catch_up()
    assert not f.reader.pending and f.reader.sweep is None and not f.reader.sweep_due
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_piece_read_while_the_engine_moved_is_thrown_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(digest_sweep, "PIECE", 8)
    engine = FollowedEngine(num_blocks=64, defer_digest=True)
    f = engine.follower
    engine.drive(15)
    f.reader.sweep_due = True
    read_piece = digest_sweep.DigestSweep._read_piece
    moves = [2]

    def racing(sweep: digest_sweep.DigestSweep, *args: object, **kw: object) -> int:
        out = read_piece(sweep, *args, **kw)  # type: ignore[arg-type]
        if moves[0]:
            moves[0] -= 1
            engine.rt.apply(AllocateOp(num_blocks=1))  # a pool call during the piece
        return out

    monkeypatch.setattr(digest_sweep.DigestSweep, "_read_piece", racing)
    assert not f.catch_up()  # the first piece saw the engine move: thrown away
    assert f.reader.sweep is not None and f.reader.sweep.rows_read == 0
    f.flush()
    assert not f.catch_up()
    f.flush()
    assert f.catch_up()  # then a moment that held
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_reset_is_read_again_off_the_engines_thread() -> None:
    engine = FollowedEngine(num_blocks=64, defer_digest=True)
    f = engine.follower
    engine.drive(10)
    assert f.catch_up() or not f.reader.pending
    ops_before = f.digest_ops
    for rid in list(engine.rt.manager.requests):
        engine.rt.apply(FinishOp(request_id=rid))
    for bid in engine.raw:
        engine.rt.apply(FreeOp(block_ids=[bid]))
    engine.raw.clear()
    engine.rt.apply(ResetOp())
    f.flush()
    assert f.reader.sweep_due and f.digest_ops == ops_before  # the engine's thread read nothing
    assert f.catch_up() and f.reader.sweeps == 1
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_ids_not_told_to_the_sweep_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digest_reader, "MAX_PENDING", 5)
    engine = FollowedEngine(num_blocks=64, defer_digest=True)
    f = engine.follower
    for _ in range(60):
        engine.step()
        assert len(f.reader.pending) <= 6
    assert f.reader.sweep_due
    assert f.catch_up() and f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_naming_and_reading_stop_when_the_engine_comes_back_and_resume_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sender's thread looks every few blocks (naming them, reading
    rows) whether the engine came back; it stops there, and what it had
    not finished is done at a later moment: the digest it ends with is the
    pool's."""
    monkeypatch.setattr(digest_sweep, "NAMED_PAUSE_EVERY", 4)
    monkeypatch.setattr(digest_module, "PAUSE_EVERY", 4)
    engine = FollowedEngine(num_blocks=128, defer_digest=True)
    f = engine.follower
    engine.drive(10)
    assert f.catch_up() and f.reader.sweep is None  # caught up, no sweep yet
    f.reader.sweep_due = True
    looks = [0]
    allowed = [10**9]

    def may_work() -> bool:
        looks[0] += 1
        return looks[0] <= allowed[0]

    monkeypatch.setattr(f.passes, "may_work", may_work)
    allowed[0] = 3  # the first look (begin), then the engine is back mid-piece
    assert not f.catch_up()
    sweep = f.reader.sweep
    assert sweep is not None and sweep.pieces_discarded == 1 and sweep.rows_read == 0
    engine.drive(6)  # the engine's pool calls: more blocks named, ≥ 4 per batch
    assert sum(len(p) for p in f.reader.pending) >= 8
    looks[0], allowed[0] = 0, 2  # now it comes back while they are named
    assert not f.catch_up()
    assert f.reader.pending and f.reader.sweep is sweep  # not all named: kept for the next moment
    looks[0], allowed[0] = 0, 10**9
    assert f.catch_up()  # a moment long enough: named, every row read
    assert f.reader.sweep is None and not f.reader.pending
    assert f.reader.verified is not None and f.reader.verified.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_the_pacer_sleeps_only_when_its_work_time_is_up() -> None:
    from blockpool_vllm.pacing import Pacer

    never = Pacer(every_ns=10**15)
    assert not any(never() for _ in range(1000)) and never.sleeps == 0
    always = Pacer(every_ns=0, sleep_s=0.0)
    assert all(always() for _ in range(5)) and always.sleeps == 5
    always.rested()
    assert always() and always.sleeps == 6


def test_the_pacing_thread_tightens_its_own_timer_slack_only() -> None:
    """On Linux the thread that calls it gets a 1 µs timer slack (read back
    through prctl); another thread keeps its own."""
    import ctypes
    import sys
    import threading

    from blockpool_vllm.pacing import TIMER_SLACK_NS, tighten_timer_slack

    if not sys.platform.startswith("linux"):
        assert tighten_timer_slack() is False
        return
    libc = ctypes.CDLL(None)
    got: dict[str, int | bool] = {}

    def thread() -> None:
        got["before"] = libc.prctl(30, 0, 0, 0, 0)  # PR_GET_TIMERSLACK
        got["done"] = tighten_timer_slack()
        got["after"] = libc.prctl(30, 0, 0, 0, 0)

    mine = libc.prctl(30, 0, 0, 0, 0)
    t = threading.Thread(target=thread)
    t.start()
    t.join(60)
    assert got["after"] == (TIMER_SLACK_NS if got["done"] else got["before"])
    assert libc.prctl(30, 0, 0, 0, 0) == mine  # this thread's own: unchanged


def test_a_sweep_begins_no_piece_it_cannot_read_before_the_engine_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a planned forward pass the sweep reads the first piece, always
    (progress), then pieces as large as the time left before the plan's
    deadline allows (its measured time a row), and none once no row fits:
    it stops with every piece it read kept -- none thrown away, the engine
    back finds the sender waiting -- and goes on at the next moment."""
    monkeypatch.setattr(digest_sweep, "PIECE", 16)
    clock = [10**12]  # the follower's clock: rows read take 1 ms each
    monkeypatch.setattr(forward_pass, "_now", lambda: clock[0])
    monkeypatch.setattr(digest_reader, "_now", lambda: clock[0])
    read_piece = digest_sweep.DigestSweep._read_piece

    def timed(sweep: digest_sweep.DigestSweep, ids: list[int], pause: object) -> int:
        clock[0] += 1_000_000 * len(ids)
        return read_piece(sweep, ids, pause)  # type: ignore[arg-type]

    monkeypatch.setattr(digest_sweep.DigestSweep, "_read_piece", timed)
    engine = FollowedEngine(num_blocks=256, defer_digest=True, windowed=True)
    f = engine.follower
    for _ in range(forward_pass.KEPT):  # forward passes of 50 ms
        f.passes.begins()
        f.passes.began -= 50_000_000
        f.passes.ends()
    engine.drive(8)
    f.reader.sweep_due = True
    f.passes.begins()
    f.passes.began -= 22_500_000  # 20 ms left before the plan's end (85 % of 50 ms)
    f.passes.plan()
    assert f.passes.deadline == clock[0] + 20_000_000
    f.reader.sweep_ns_per_row = 1_000_000.0  # (as measured)
    assert not f.catch_up()
    sweep = f.reader.sweep
    assert sweep is not None and not f.reader.pending  # the batches named first
    assert sweep.rows_read == 16 + 4  # a piece, then the 4 rows that fit: none begun after
    assert sweep.pieces_discarded == 0 and clock[0] == f.passes.deadline
    assert f.reader.sweep_ns_per_row == 1_000_000.0  # measured again: the same
    f.passes.began -= 30_000_000
    f.passes.ends()
    f.passes.begins()  # the next pass, all of it left: 42.5 rows' time
    f.passes.plan()
    assert not f.catch_up()
    assert sweep.rows_read == 20 + 42 and sweep.pieces_discarded == 0
    f.passes.ends()
    f.passes.last_flush = 0.0  # an idle engine: no deadline, the rest in one go
    f.passes.plan()
    assert f.passes.deadline == 0
    assert f.catch_up() and f.reader.sweep is None and f.reader.sweeps_finished == 1
    assert sweep.pieces_discarded == 0 and sweep.rows_read == 255
    assert f.reader.verified is not None and f.reader.verified.value == pool_digest(engine.rt.pool)
    engine.rt.check()
