"""Timed mode: arrivals at their timestamps, decode, vLLM's scheduler above the pool.

One scheduler: vLLM 0.16's v1 scheduler (``scheduler.py``, ``engine.py``,
``scheduled.py``).  ``TimedConfig(scheduler=SchedulerConfig(...))`` runs it
with those settings; without one it runs with every feature off
(:func:`simple_scheduler`): FCFS, synchronous, whole prompts, no token
budget, at most ``max_running`` running, one step every ``step_ms`` of
simulated time.  Each step of that one:

1. running requests, oldest first, each get a slot for their next token;
   when the pool has too few free blocks the *newest* running request is
   preempted (its blocks freed, back to the head of the queue, recomputed
   from its prompt and the tokens it had when readmitted) -- until the
   request fits or is itself the one preempted;
2. if nothing was preempted, waiting requests are admitted in order while
   fewer than ``max_running`` run and the pool has the blocks (the first
   that does not fit stops admission);
3. requests that have their ``output_length`` tokens finish (freed in reverse).

A request of ``L`` prompt and ``O`` output tokens holds ``L + O - 1`` tokens
at most (the last token is sampled, never stored); one that needs more
blocks than the pool holds besides the null block is refused at arrival.
No one-pass shortcut applies here: blocks are held across requests, so each
capacity is its own replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blockpool.core.attention import GroupSpec
from blockpool.core.free_order import APPEND_ALL, FreeOrder
from blockpool.core.hashing import HashFn
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.sched.engine_core import StepModel
from blockpool.trace.sched.scheduled import replay_scheduled
from blockpool.trace.sched.scheduler import SchedulerConfig
from blockpool.trace.workload.reader import Trace


def simple_scheduler(max_running: int) -> SchedulerConfig:
    """vLLM's scheduler with every feature off: no budget, whole prompts, synchronous."""
    return SchedulerConfig(None, max_running, False, 0, None, "fcfs", False)


@dataclass
class TimedConfig:
    """``scheduler``: vLLM's scheduler with these settings (None: with every
    feature off, :func:`simple_scheduler`); ``step_model``: its step times
    (None: ``step_ms`` a step); ``groups``: the pool's KV-cache groups
    (empty: one full-attention group)."""

    speed: float = 1.0
    step_ms: float = 20.0
    max_running: int = 256
    scheduler: SchedulerConfig | None = None
    step_model: StepModel | None = None
    groups: tuple[GroupSpec, ...] = ()

    def __post_init__(self) -> None:
        if not self.speed > 0 or not self.step_ms > 0 or self.max_running < 1:
            raise ValueError("speed and step_ms must be > 0, max_running >= 1")


def replay_timed(
    trace: Trace,
    block_size: int,
    capacities_tokens: Sequence[int | None],
    hash_fn: HashFn,
    free_order: FreeOrder = APPEND_ALL,
    config: TimedConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[CapacityResult]:
    """Timed mode at each capacity (one replay each) through vLLM's scheduler."""
    cfg = config or TimedConfig()
    sched = cfg.scheduler or simple_scheduler(cfg.max_running)
    model = cfg.step_model or StepModel(cfg.step_ms)
    return replay_scheduled(
        trace, block_size, capacities_tokens, hash_fn, free_order, sched, model, cfg.speed,
        progress, cfg.groups,
    )  # fmt: skip
