"""The service's garbage collections: young survivors frozen and real full
collections paced by its ticks, within a budget, and the interpreter's own
threshold put back when the last user stops."""

from __future__ import annotations

import asyncio
import gc
import weakref
from types import ModuleType, SimpleNamespace
from typing import cast

import pytest

from app.pool import gc_pacer as pc
from app.pool.engine import Engine
from app.pool.gc_pacer import BUDGET, FREEZE_EVERY_S, FULL_EVERY_S, OUT_OF_REACH, GcPacer
from app.shared.settings import Settings


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def fake_gc(clock: FakeClock, full_s: float) -> tuple[ModuleType, list[str]]:
    """A collector that logs its calls; a full collection takes ``full_s``."""
    calls: list[str] = []

    def collect(gen: int) -> int:
        calls.append(f"collect{gen}")
        if gen == 2:
            clock.t += full_s
        return 0

    g = SimpleNamespace(
        collect=collect,
        freeze=lambda: calls.append("freeze"),
        unfreeze=lambda: calls.append("unfreeze"),
        get_freeze_count=lambda: 7,
    )
    return cast(ModuleType, g), calls


def test_survivors_are_frozen_every_interval_and_a_full_collection_waits_its_turn() -> None:
    clock = FakeClock()
    g, calls = fake_gc(clock, 0.5)
    p = GcPacer(clock, g)
    assert p.maybe_collect() is None  # not paced: never
    p.start()
    try:
        assert p.maybe_collect() is None and calls == []  # nothing due yet
        clock.t += FREEZE_EVERY_S
        assert p.maybe_collect() == "freeze" and calls == ["collect1", "freeze"]
        clock.t += FREEZE_EVERY_S / 2
        assert p.maybe_collect() is None
        clock.t += FULL_EVERY_S
        calls.clear()
        assert p.maybe_collect() == "full"
        assert calls == ["unfreeze", "collect2", "freeze"]
        # the full one took 0.5 s: the next after max(FULL_EVERY_S, 0.5 / BUDGET)
        wait = max(FULL_EVERY_S, 0.5 / BUDGET)
        clock.t += FREEZE_EVERY_S
        assert p.maybe_collect() == "freeze"
        clock.t += wait - FREEZE_EVERY_S - 0.01
        assert p.maybe_collect() == "freeze"
        clock.t += 0.01
        assert p.maybe_collect() == "full"
        assert p.readings() == {
            "freezes_total": 3,
            "full_collections_total": 2,
            "full_collection_ms_total": 1000,
            "last_full_collection_ms": pytest.approx(500.0),
            "frozen_objects": 7,
        }
    finally:
        p.stop()


def test_a_full_collection_too_long_for_the_interval_pushes_the_next_further() -> None:
    clock = FakeClock()
    long = 2.0 * FULL_EVERY_S * BUDGET  # twice what the interval allows
    g, _ = fake_gc(clock, long)
    p = GcPacer(clock, g)
    p.start()
    try:
        clock.t += FULL_EVERY_S
        assert p.maybe_collect() == "full"
        clock.t += FULL_EVERY_S
        assert p.maybe_collect() == "freeze"  # not yet: took / BUDGET = 2 intervals
        clock.t += FULL_EVERY_S
        assert p.maybe_collect() == "full"
    finally:
        p.stop()


def test_no_reading_of_a_full_collection_before_one_ran() -> None:
    clock = FakeClock()
    p = GcPacer(clock, fake_gc(clock, 0.0)[0])
    assert p.readings() == {
        "freezes_total": 0,
        "full_collections_total": 0,
        "full_collection_ms_total": 0,
        "frozen_objects": 7,
    }
    assert set(p.figures.help) == {*p.readings(), "last_full_collection_ms"}


def test_the_threshold_is_put_back_when_the_last_user_stops() -> None:
    found = gc.get_threshold()
    a, b = GcPacer(), GcPacer()
    a.start()
    b.start()
    a.start()  # twice: counted once
    assert gc.get_threshold() == (found[0], found[1], OUT_OF_REACH)
    a.stop()
    a.stop()
    assert gc.get_threshold()[2] == OUT_OF_REACH  # b still paces
    gc.freeze()  # (as a tick would have)
    assert gc.get_freeze_count() > 0
    b.stop()
    assert gc.get_threshold() == found and pc._users == 0
    assert gc.get_freeze_count() == 0  # thawed: nothing left out of the collector's reach


def _full_collections_while_keeping(n: int) -> int:
    """Full collections the interpreter ran on its own while ``n`` new
    lists were kept alive (as the event log keeps its events' hashes)."""
    before = gc.get_stats()[2]["collections"]
    kept = [[i] for i in range(n)]
    after = gc.get_stats()[2]["collections"]
    del kept
    return after - before


def test_while_paced_the_interpreter_runs_no_full_collection_of_its_own() -> None:
    was = gc.isenabled()
    gc.enable()
    found = gc.get_threshold()
    gc.set_threshold(100, 2, 2)  # a full collection soon after the oldest generation grows
    try:
        # CPython runs one once the objects promoted since the last pass a
        # quarter of its survivors: keep half as many lists as survive now
        # (a long test session holds millions of objects)
        gc.collect()
        n = len(gc.get_objects(2)) // 2 + 50_000
        assert _full_collections_while_keeping(n) > 0  # unpaced: it runs them
        p = GcPacer()
        p.start()
        try:
            gc.collect()
            assert _full_collections_while_keeping(n) == 0
        finally:
            p.stop()
        assert gc.get_threshold() == (100, 2, 2)
    finally:
        gc.set_threshold(*found)
        if not was:
            gc.disable()


def test_a_frozen_object_is_still_freed_by_its_reference_count_and_a_full_one_frees_cycles() -> (
    None
):
    """What the pacer relies on: freezing moves no object's lifetime but a
    cycle's, and the full collection (thawed) frees that cycle."""

    class Node:
        other: object = None

    kept = Node()
    gone = weakref.ref(kept)
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle, garbage from the next line on
    cyc = weakref.ref(a)
    del a, b
    gc.freeze()
    try:
        del kept
        assert gone() is None  # freed at once, frozen or not
        gc.collect()
        assert cyc() is not None  # frozen: no collection sees it
        gc.unfreeze()
        gc.collect()
        assert cyc() is None
    finally:
        gc.unfreeze()


def test_the_engine_paces_while_it_runs() -> None:
    found = gc.get_threshold()
    engine = Engine(Settings(num_blocks=64, block_size=4))

    async def run() -> None:
        await engine.start()
        try:
            assert engine.gc_pacer.paced and gc.get_threshold()[2] == OUT_OF_REACH
            assert gc.get_freeze_count() > 0  # the pool's blocks, out of the collector's way
        finally:
            await engine.stop()

    asyncio.run(run())
    assert not engine.gc_pacer.paced and gc.get_threshold() == found
    assert gc.get_freeze_count() == 0
    engine.check()
