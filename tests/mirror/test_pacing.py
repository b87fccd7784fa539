"""The plugin's thread's pacing (blockpool_vllm/pacing.py): short pieces of
work between two sleeps while the engine may want the interpreter, long ones
once its sleeps show the engine waiting for its pass -- never past the
plan's deadline -- and short again the moment a sleep shows it running.
A clock of the test's own: the sleeps take what the test says."""

from __future__ import annotations

import pytest

from blockpool_vllm import pacing
from blockpool_vllm.forward_pass import END_SHARE, KEPT
from blockpool_vllm.pacing import EVERY_NS, LONG_EVERY_NS, ON_TIME_NS, QUIET_SLEEPS, Pacer
from tests.mirror.workload import FollowedEngine


class Clock:
    """perf_counter_ns and time.sleep for the pacer: each sleep lasts
    ``sleep_ns`` (what the engine's thread did meanwhile)."""

    def __init__(self) -> None:
        self.now = 1_000_000_000
        self.sleep_ns = 130_000

    def perf_counter_ns(self) -> int:
        return self.now

    def sleep(self, _s: float) -> None:
        self.now += self.sleep_ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(pacing, "perf_counter_ns", c.perf_counter_ns)
    monkeypatch.setattr(pacing.time, "sleep", c.sleep)
    return c


def work_until_sleep(pace: Pacer, clock: Clock, step_ns: int = 10_000) -> int:
    """Work in steps of ``step_ns``, calling the pacer between them, until
    it sleeps: the work done (ns) since the last sleep."""
    began = pace.last
    while True:
        clock.now += step_ns
        before = clock.now
        if pace():
            return before - began


def test_long_pieces_once_the_sleeps_show_the_engine_waiting_for_its_pass(clock: Clock) -> None:
    pace = Pacer()
    pace.until_ns = clock.now + 50_000_000  # a plan: 50 ms of the pass left
    pace.rested()
    # the first sleeps: short pieces (the engine may still run Python)
    for _ in range(QUIET_SLEEPS):
        assert work_until_sleep(pace, clock) == EVERY_NS
    # two sleeps on time in a row: the engine waits for its pass
    assert pace.quiet == QUIET_SLEEPS
    assert work_until_sleep(pace, clock) == LONG_EVERY_NS
    assert work_until_sleep(pace, clock) == LONG_EVERY_NS
    # a sleep that ended late: the engine ran meanwhile -- short pieces again
    clock.sleep_ns = ON_TIME_NS + 1
    assert work_until_sleep(pace, clock) == LONG_EVERY_NS
    assert pace.quiet == 0
    clock.sleep_ns = 130_000
    assert work_until_sleep(pace, clock) == EVERY_NS
    assert pace.sleeps == 6


def test_no_long_piece_past_the_plans_deadline_nor_without_a_plan(clock: Clock) -> None:
    pace = Pacer()
    pace.until_ns = clock.now + 600_000  # 0.6 ms of the pass left
    pace.rested()
    for _ in range(QUIET_SLEEPS):
        work_until_sleep(pace, clock)
    assert pace.quiet == QUIET_SLEEPS
    # ~0.34 ms left now: the piece ends at the deadline, not 1 ms later
    left = pace.until_ns - pace.last
    assert 0 < left < LONG_EVERY_NS
    assert work_until_sleep(pace, clock) == left
    # the deadline passed: short pieces however quiet
    assert pace.quiet > QUIET_SLEEPS
    assert work_until_sleep(pace, clock) == EVERY_NS
    # no plan (the engine not in a pass, or idle): short pieces
    pace.until_ns = 0
    assert work_until_sleep(pace, clock) == EVERY_NS
    # a new turn: whether the engine waits is seen afresh
    pace.until_ns = clock.now + 50_000_000
    pace.rested()
    assert pace.quiet == 0
    assert work_until_sleep(pace, clock) == EVERY_NS


def test_a_planned_pass_gives_the_pacer_its_deadline() -> None:
    engine = FollowedEngine(num_blocks=256, defer_digest=True, windowed=True)
    p = engine.follower.passes
    for _ in range(KEPT + 1):
        p.begins()
        p.began -= 8_000_000  # passes of 8 ms
        p.ends()
    p.begins()
    p.plan()
    assert p.deadline == p.pace.until_ns == p.began + int(min(p.lengths) * END_SHARE)
    assert min(p.lengths) >= 8_000_000
    p.ends()  # the engine's thread back: the pass is over
    assert p.pace.until_ns == 0
    p.plan()  # not in a pass: no plan
    assert p.deadline == p.pace.until_ns == 0
    engine.rt.check()
