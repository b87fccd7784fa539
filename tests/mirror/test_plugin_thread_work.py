"""The plugin's thread at work in the engine's forward passes
(blockpool_vllm/digest_reader.py, follower.py):

* a block a batch names while it waits from an earlier one is not added
  again: read once, after every change;
* a reader behind, in a planned pass, reads the small batches pending as
  one reading where the time planned leaves room for them
  (``DigestReader._joined``): one stage of the pool for all of them, a block
  several name read once, and the digest the pool's -- as exact as reading
  them batch by batch;
* preparing a long batch for the wire lets the engine in between calls."""

from __future__ import annotations

import time
from typing import Any

import pytest

from blockpool.mirror.digest import pool_digest
from blockpool.runtime.ops import AllocateOp, FreeOp
from blockpool_vllm.forward_pass import KEPT
from tests.mirror.workload import FollowedEngine


def planned_passes(engine: FollowedEngine, length_ns: int) -> None:
    f = engine.follower
    for _ in range(KEPT):
        f.passes.begins()
        f.passes.began -= length_ns
        f.passes.ends()
    f.passes.begins()
    f.passes.plan()


def counted_stages(engine: FollowedEngine) -> list[list[int]]:
    stages: list[list[int]] = []
    stage = engine.follower.digest.stage

    def counted(ids: Any, pause: Any = None) -> Any:
        stages.append(list(ids))
        return stage(ids, pause)

    engine.follower.digest.stage = counted  # type: ignore[method-assign]
    return stages


def test_small_batches_pending_are_read_as_one_reading_a_block_named_twice_read_once() -> None:
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    f = engine.follower
    held: list[int] = []
    for _ in range(6):  # six steps: each allocates 5 blocks, frees 2 of the last step's
        got = engine.rt.apply(AllocateOp(num_blocks=5))
        if held:
            engine.rt.apply(FreeOp(block_ids=held[:2]))
        held = list(got["block_ids"])
        f.flush()
    batches = [list(p) for p in f.reader.pending]
    assert len(batches) == 6
    named = [b for p in batches for b in p]
    # 40 blocks named (6 x 5 allocated, 5 x 2 freed): those freed were waiting
    # already (allocated by the batch before, not read yet), not added again
    assert len(named) == len(set(named)) == 30
    stages = counted_stages(engine)
    planned_passes(engine, 10_000_000_000)  # passes of 10 s: room for all of them
    assert f.catch_up()
    assert len(stages) == 1 and stages[0] == named  # one reading, the batches in order
    assert not f.reader.pending and f.reader.digests_discarded == 0
    assert f.reader.verified is not None and f.reader.verified.ops == f.op_count
    assert f.digest.value == f.reader.verified.value == pool_digest(engine.rt.pool)
    engine.rt.check()


@pytest.mark.parametrize("room", [0, 12, 23])
def test_only_whole_batches_the_plan_has_room_for_are_joined(room: int) -> None:
    """``room`` blocks' time left in the pass: the first batch (fewer blocks
    than ``MIN_PIECE``) is read whole whatever the room (progress), the
    next ones joined to it only while all of them fit; the rest later."""
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    f = engine.follower
    for _ in range(4):
        engine.rt.apply(AllocateOp(num_blocks=5))
        f.flush()
    sizes = [len(p) for p in f.reader.pending]
    assert sizes == [5, 5, 5, 5]
    stages = counted_stages(engine)
    planned_passes(engine, 10_000_000_000)
    f.reader.read_ns_per_block = 1e9  # a block's reading takes a second
    f.passes.deadline = time.perf_counter_ns() + room * 1_000_000_000 + 500_000_000
    may_work = f.passes.may_work
    f.passes.may_work = lambda: len(stages) < 1  # type: ignore[method-assign]
    joined = max(1, min(4, room // 5))
    assert f.catch_up() == (joined == 4)  # one reading at this moment: all, or not
    f.passes.may_work = may_work  # type: ignore[method-assign]
    assert [len(s) for s in stages] == [5 * joined]
    assert [len(p) for p in f.reader.pending] == [5] * (4 - joined)
    assert f.reader.digests_discarded == 0
    f.passes.deadline = 0  # an idle engine: the rest batch by batch
    assert f.catch_up() == (joined < 4) and not f.reader.pending  # (nothing left: nothing due)
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_the_senders_thread_lets_the_engine_in_while_it_prepares_a_long_batch() -> None:
    """Preparing a batch (its calls' blocks read into wire operations, off
    the engine's thread) paces between two calls, as reading the digest
    does: a step naming thousands of blocks is milliseconds of work, and an
    engine back from its pass meanwhile waits for the interpreter."""
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    f = engine.follower
    paced: list[int] = []
    pace = f.passes.pace
    f.passes.pace = lambda: paced.append(len(paced)) is None  # type: ignore[assignment,method-assign]
    got = [engine.rt.apply(AllocateOp(num_blocks=3))["block_ids"] for _ in range(4)]
    engine.rt.apply(FreeOp(block_ids=got[0]))
    f.flush()  # (FollowedEngine's offer prepares it, as the sender's thread would)
    assert len(paced) == 5  # once before each of the five calls
    assert [len(p) for p in f.reader.pending] == [12]  # (the freed were waiting already)
    assert [op.ids for op in engine.batches[-1].ops] == [*got, got[0]]
    f.passes.pace = pace  # type: ignore[method-assign]
    f.passes.last_flush = 0.0  # the engine idle since: the digest read
    assert f.catch_up() and f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()
