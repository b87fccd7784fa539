"""Drive the engine from a production trace at its timestamps (instead of the demo).

Requests arrive at ``timestamp / speed`` after the start and go through
vLLM 0.16's scheduler (``blockpool.trace.sched.scheduler``, the timed replay's),
synchronous, with chunked prefill: at most ``prefill_chunk`` prompt tokens of
one request a step (its ``long_prefill_token_threshold``), at most
``step_tokens`` tokens a step (``max_num_batched_tokens``), at most
``max_running`` requests running (``max_num_seqs``); a request that cannot
grow preempts the newest running one, recomputed later from its prompt and
the tokens it had.  The scheduler's slots are the runtime's operations
(``blockpool.trace.sched.runtime_slots``): an admission looks up the whole
prompt's cached prefix and admits that prefix and its first chunk, later
chunks and decode tokens are appended, a finish or a preemption frees.

The replay's clock follows the wall clock times ``speed``; each tick runs
the engine steps (``step_ms`` of trace time each, at most
``MAX_STEPS_PER_TICK``) that fit the time passed, each step one engine
command, so no command holds the event loop for long whatever the trace's
sizes (tokens are built only for the chunk at hand).  With ``loop`` the
trace starts over when done (new request ids).  A stop gives the running
requests' blocks back and puts them at the head of the queue.

Tokens come from ``blockpool.trace`` (hash id ``h`` at offset ``j``: one
token per ``(h, j)``; outputs unique per request).  What an uploaded trace
may imply is bounded (``app/trace/limits.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.pool.views.trace import TraceBound, TraceStats, TraceStatus
from app.pool.workload_task import WorkloadTask
from app.shared.errors import Conflict, InvalidInput, OperationError
from app.trace.limits import TraceRefused, check_trace
from blockpool.common.figures import Figures, counter, helps, rest_view, totals
from blockpool.core.free_order import check_free_order
from blockpool.trace import Trace
from blockpool.trace.plan.planner import bound_at
from blockpool.trace.sched.engine_core import StepModel
from blockpool.trace.sched.runtime_slots import RuntimeSlots, live_request
from blockpool.trace.sched.scheduler import Scheduler, SchedulerConfig

if TYPE_CHECKING:
    from app.pool.engine import Engine

logger = logging.getLogger("blockpool.trace")
STEP_S = 0.05
STEP_MS = 20.0  # trace time an engine step takes
MAX_STEPS_PER_TICK = 8
PREFILL_CHUNK = 256  # prompt tokens of one request a step: its K/V writes take a few ms
STEP_TOKENS = 4096


@dataclass
class DriverStats:
    arrived: int = counter(
        "Trace requests arrived (every pass of a looping replay).",
        metric="requests_arrived_total",
    )
    admitted: int = counter("Trace requests admitted (first schedule).", metric=None)
    finished: int = counter("Trace requests finished.", metric="requests_finished_total")
    refused: int = counter(
        "Trace requests the engine refused outright (never admitted).",
        metric="requests_refused_total",
    )
    preemptions: int = counter(
        "Running trace requests preempted for lack of blocks (recomputed later).",
        metric="preemptions_total",
    )
    prompt_tokens: int = counter(
        "Prompt tokens of the admitted trace requests.", metric="prompt_tokens_total"
    )
    hit_tokens: int = counter(
        "Cached prompt tokens of the admitted trace requests at their first schedule.",
        metric="hit_tokens_total",
    )
    loops: int = counter("Passes of a looping replay completed.", metric=None)


TRACE_HELP = {
    **helps(DriverStats),
    "running": "1 while a trace replay runs.",
    "requests_waiting": "Trace requests arrived and not running.",
}


class TraceDriver(WorkloadTask[int, TraceStatus]):
    def __init__(self, engine: Engine, speed: float = 1.0, loop: bool = False) -> None:
        super().__init__(engine, "trace-replay")
        self.speed = speed
        self.loop = loop
        self.max_running = 64
        self.prefill_chunk = PREFILL_CHUNK
        self.step_tokens = STEP_TOKENS
        self.trace: Trace | None = None
        self.name: str | None = None
        self.stats = DriverStats()
        self.figures = Figures(self.metrics, TRACE_HELP)
        self.pending: deque[int] = deque()
        self.clock_ms = 0.0
        self.bound: dict[str, Any] | None = None
        self._sched: Scheduler | None = None
        self._slots: RuntimeSlots | None = None
        self._model = StepModel(STEP_MS)
        self._admitted: set[str] = set()  # requests counted at their first schedule
        self._sim_ms = 0.0

    @property
    def waiting(self) -> Any:
        """The requests arrived and not running (``len`` of it)."""
        return self._sched.waiting if self._sched is not None else ()

    # ------------------------------------------------------------- control

    def load(self, trace: Trace, name: str) -> None:
        """Take a validated trace (refused while a replay runs)."""
        if self.running_task:
            raise Conflict("a trace replay is running: stop it first")
        try:
            check_trace(trace, self.engine.settings)
        except TraceRefused as exc:
            exc.message = f"trace {name!r}: {exc.message}"
            exc.args = (exc.message,)
            raise
        self.trace, self.name = trace, name
        self._reset()
        self.bound = None
        pool = self.engine.pool
        args = (trace, pool.hash_block_size, pool.num_gpu_blocks, pool.free_order)
        threading.Thread(target=self._bound, args=args, daemon=True).start()

    def _bound(self, trace: Trace, block_size: int, num_blocks: int, free_order: str) -> None:
        """LRU (the pool's own free order) against the offline optimum for the
        what-if panel, off the loop."""
        try:
            bound = bound_at(trace, block_size, num_blocks, check_free_order(free_order))
        except Exception:  # a bound is a hint: never the replay's failure
            logger.exception("trace bound")
            return
        if self.trace is trace:
            self.bound = bound

    def _reset(self) -> None:
        self.stats = DriverStats()
        self.pending = deque(range(len(self.trace or ())))
        self.clock_ms = self._sim_ms = 0.0
        self._sched = self._slots = None
        self._admitted.clear()
        self.running = {}

    def _scheduler(self) -> Scheduler:
        """The scheduler of this pass, made with the settings of its start."""
        if self._sched is None:
            assert self.trace is not None
            engine = self.engine
            slots = RuntimeSlots(self.trace, lambda op: engine.apply(op), engine.manager)
            budget = self.step_tokens
            config = SchedulerConfig(
                max_num_batched_tokens=budget,
                max_num_seqs=min(self.max_running, budget),
                enable_chunked_prefill=True,
                long_prefill_token_threshold=self.prefill_chunk,
                async_scheduling=False,
            )
            self._slots, self._sched = slots, Scheduler(slots, config)
            self.running = slots.held
        return self._sched

    def configure(self, speed: float | None = None, loop: bool | None = None) -> None:
        if speed is not None:
            if not 0 < speed <= 10_000:
                raise InvalidInput("speed: need 0 < speed <= 10000", speed=speed)
            self.speed = speed
        if loop is not None:
            self.loop = loop

    def ensure_startable(self) -> None:
        if self.trace is None:
            raise Conflict("no trace loaded: upload one (POST /api/trace/upload) or serve --trace")
        super().ensure_startable()

    def _idle(self) -> bool:
        return not self.pending and (self._sched is None or not self._sched.has_unfinished())

    def start(self) -> None:
        self.ensure_startable()
        if not self.running_task:
            idle = self._idle()
            self._spawn(self._loop)  # a 409 when another workload runs
            if idle:
                self._reset()  # finished: start over

    async def stop(self, finish_running: bool = True) -> None:
        await self._cancel()
        if finish_running and self.running:
            await self.engine.submit(self._pause)

    def _pause(self) -> None:
        """Give the running requests' blocks back, queued first (engine context)."""
        sched = self._sched
        if sched is not None:
            for r in reversed(list(sched.running)):
                sched.requeue(r)

    def status(self) -> TraceStatus:
        s = self.stats
        total = len(self.trace) if self.trace is not None else 0
        last = self.trace.requests[-1].timestamp_ms if self.trace is not None else 0.0
        hit_rate = s.hit_tokens / s.prompt_tokens if s.prompt_tokens else 0.0
        return TraceStatus(
            loaded=self.trace is not None,
            name=self.name,
            running=self.running_task,
            speed=self.speed,
            loop=self.loop,
            requests=total,
            trace_ms=self.clock_ms,
            trace_end_ms=last,
            progress=(s.arrived - s.loops * total) / total if total else 0.0,
            requests_running=len(self.running),
            requests_waiting=len(self.waiting),
            stats=TraceStats(**rest_view(s), hit_rate=hit_rate),
            bound=None if self.bound is None else TraceBound(**self.bound),
        )

    def metrics(self) -> dict[str, float]:
        return {
            "running": float(self.running_task),
            "requests_waiting": float(len(self.waiting)),
            **{k: float(v) for k, v in totals(self.stats).items()},
        }

    # ---------------------------------------------------------------- loop

    async def _loop(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(STEP_S)
            now = time.monotonic()
            self.clock_ms += (now - last) * 1000.0 * self.speed
            last = now
            for _ in range(MAX_STEPS_PER_TICK):
                try:
                    more = await self.engine.submit(self._step)
                except OperationError:
                    logger.exception("trace step refused")
                    break
                if not more:
                    break
            if self._idle():
                if not self.loop:
                    return
                self.stats.loops += 1
                self.pending = deque(range(len(self.trace or ())))
                self.clock_ms = self._sim_ms = 0.0

    def _step(self) -> bool:
        """Arrivals up to the replay's clock, then one engine step when its
        time has come (engine context); whether another step fits the tick."""
        sched = self._scheduler()
        slots = self._slots
        assert slots is not None and self.trace is not None
        reqs = self.trace.requests
        while self.pending and reqs[self.pending[0]].timestamp_ms <= self.clock_ms:
            i = self.pending.popleft()
            self.stats.arrived += 1
            rid = f"trace-{self.stats.loops}-{i}"
            sched.add(live_request(self.trace, reqs[i], rid, reqs[i].timestamp_ms))
        if not sched.has_requests():
            self._sim_ms = max(self._sim_ms, self.clock_ms)
            return False
        if self._sim_ms > self.clock_ms:
            return False
        now = self._sim_ms
        before = sched.preemptions
        plan = sched.schedule(now)
        s = self.stats
        counted = self._admitted
        for rid in plan.num_scheduled:
            if rid not in counted:  # its first schedule
                counted.add(rid)
                r = sched.requests[rid]
                s.admitted += 1
                s.prompt_tokens += r.num_prompt_tokens
                s.hit_tokens += r.num_cached_tokens
        dt = self._model.ms(plan)
        finished = sched.update(plan, now + dt)
        self._sim_ms = now + dt
        s.preemptions += sched.preemptions - before
        s.finished += len(finished)
        for r in finished:
            counted.discard(r.rid)
        for rid in slots.refused:  # refused for good: dropped
            if (refused := sched.requests.get(rid)) is not None:
                sched.drop(refused)
                s.refused += 1
        slots.refused.clear()
        for rid in slots.lost:  # finished by another client: recomputed
            if (lost := sched.requests.get(rid)) is not None:
                sched.requeue(lost)
        slots.lost.clear()
        return self._sim_ms <= self.clock_ms
