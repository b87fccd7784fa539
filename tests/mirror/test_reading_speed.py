"""The plugin's reader measures how fast it reads, and plans by it
(blockpool_vllm/digest_reader.py): a reading the engine's return cut
short counts too, else the slow readings -- the ones thrown away -- would
never slow the plan down, and it would plan too long again and again."""

from __future__ import annotations

from typing import Any

import pytest

from blockpool.mirror.digest import pool_digest
from blockpool.runtime.ops import AllocateOp
from blockpool_vllm import digest_reader, forward_pass
from blockpool_vllm.forward_pass import KEPT
from tests.mirror.workload import FollowedEngine


@pytest.mark.parametrize("back_after_ms", [100, 10])
def test_a_reading_cut_short_by_the_engines_return_slows_the_plan_when_it_was_slower(
    monkeypatch: pytest.MonkeyPatch, back_after_ms: int
) -> None:
    clock = [10**12]
    monkeypatch.setattr(forward_pass, "_now", lambda: clock[0])
    monkeypatch.setattr(digest_reader, "_now", lambda: clock[0])
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    f = engine.follower
    for _ in range(KEPT):  # forward passes of a second: every block's time planned
        f.passes.begins()
        f.passes.began -= 1_000_000_000
        f.passes.ends()
    measured = 100_000.0  # 0.1 ms a block, as measured so far
    f.reader.read_ns_per_block = measured
    engine.rt.apply(AllocateOp(num_blocks=300))
    f.flush()
    f.passes.begins()
    f.passes.plan()
    stage = f.digest.stage

    def engine_back_meanwhile(ids: Any, pause: Any = None) -> Any:
        staged = stage(ids, pause)
        clock[0] += back_after_ms * 1_000_000  # the engine back this long after
        f.passes.ends()  # the reading began: it was not done by then
        engine.rt.apply(AllocateOp(num_blocks=1))  # and it moved the pool
        clock[0] += 1_000_000_000
        return staged

    f.digest.stage = engine_back_meanwhile  # type: ignore[method-assign]
    assert not f.catch_up()
    assert f.reader.digests_discarded == f.reader.windows_overrun == 1
    at_least = back_after_ms * 1_000_000 / 300
    if at_least > measured:  # 333 µs a block at least: slower than measured
        assert f.reader.read_ns_per_block == pytest.approx(measured + (at_least - measured) / 4)
    else:  # 33 µs a block at least: says nothing more than the measure
        assert f.reader.read_ns_per_block == measured
    f.digest.stage = stage  # type: ignore[method-assign]
    f.flush()
    f.passes.begins()
    f.passes.plan()
    assert f.catch_up() and f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()
