"""A digest reading the engine's forward pass is too short for
(blockpool_vllm/digest_reader.py): it stops at the plan's deadline, keeps
what it read, and reads the blocks left first at the next pass -- never
begun again from scratch at every pass and thrown away when the engine is
back, which left a GPU-sized engine's digest behind for good."""

from __future__ import annotations

import random
from typing import Any

import pytest

from blockpool.mirror.digest import pool_digest
from blockpool.runtime import ops
from blockpool_vllm import digest_reader, forward_pass
from blockpool_vllm.forward_pass import KEPT
from tests.mirror.workload import FollowedEngine

PASS_NS = 100_000_000  # each forward pass: 100 ms (a fake clock)
PAUSE_NS = 20_000_000  # ... and 64 blocks read take 20 ms of it (a pause every 64)


def slow_engine(monkeypatch: pytest.MonkeyPatch, seed: int) -> tuple[FollowedEngine, list[int]]:
    """An engine whose passes leave time for ~300 blocks of reading, the
    plugin's thread charged ``PAUSE_NS`` at every pause, the engine back
    (``may_work`` false) once the pass's 100 ms are over."""
    engine = FollowedEngine(num_blocks=2048, defer_digest=True, windowed=True)
    engine.rng = random.Random(seed)
    f = engine.follower
    engine.drive(40)  # blocks cached, freed, hit in the queue's middle ...
    f.passes.last_flush = 0.0  # ... read by an idle engine's reader, whole
    assert f.catch_up() or not f.reader.due
    clock = [10**12]
    monkeypatch.setattr(forward_pass, "_now", lambda: clock[0])
    monkeypatch.setattr(digest_reader, "_now", lambda: clock[0])
    for _ in range(KEPT):
        f.passes.begins()
        f.passes.began -= PASS_NS
        f.passes.ends()

    def pace() -> bool:
        clock[0] += PAUSE_NS
        return False

    def may_work() -> bool:
        return f.passes.forwarding and clock[0] < f.passes.began + PASS_NS

    monkeypatch.setattr(f.passes, "pace", pace)
    monkeypatch.setattr(f.passes, "may_work", may_work)
    f.reader.read_ns_per_block = 1.0  # (a plan that thinks every batch fits)
    return engine, clock


def a_pass(engine: FollowedEngine, clock: list[int]) -> bool:
    """One forward pass the reader works in; whether it took the digest."""
    f = engine.follower
    f.passes.begins()
    f.passes.plan()
    took = f.catch_up()
    clock[0] = f.passes.began + PASS_NS
    f.passes.ends()
    return took


@pytest.mark.parametrize("seed", range(4))
def test_a_reading_longer_than_a_pass_is_kept_in_parts_and_ends_at_the_pools_digest(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    engine, clock = slow_engine(monkeypatch, seed)
    f = engine.follower
    got = engine.rt.apply(ops.AllocateOp(num_blocks=1200))["block_ids"]  # one step, 1,200 blocks
    engine.rt.apply(ops.FreeOp(block_ids=got[::2]))  # and 600 of them back in the queue
    f.flush()
    passes = 0
    while not a_pass(engine, clock):
        passes += 1
        assert passes < 40  # (before: never -- every reading thrown away when the engine came)
        assert f.reader.digests_discarded == 0  # each stopped in time, what it read kept
    assert f.reader.readings_stopped >= 3  # ~300 blocks a pass, 1,800 to read at least
    assert f.reader.verified is not None and f.reader.verified.ops == f.op_count
    assert f.digest.value == f.reader.verified.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_stopped_reading_whose_pool_moved_meanwhile_is_thrown_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, clock = slow_engine(monkeypatch, 0)
    f = engine.follower
    engine.rt.apply(ops.AllocateOp(num_blocks=900))
    f.flush()
    stage = f.digest.stage

    def racing(ids: Any, pause: Any = None) -> Any:
        try:
            return stage(ids, pause)
        finally:  # a pool call while it was read (an engine back and moving)
            engine.rt.apply(ops.AllocateOp(num_blocks=1))

    f.digest.stage = racing  # type: ignore[method-assign]
    before = f.digest.value
    assert not a_pass(engine, clock)
    assert f.reader.digests_discarded == 1 and f.reader.readings_stopped == 0
    assert f.digest.value == before  # nothing of it taken
    f.digest.stage = stage  # type: ignore[method-assign]
    f.flush()
    while not a_pass(engine, clock):
        pass
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()
