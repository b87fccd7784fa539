"""Drive the engine from a production trace at its timestamps (instead of the demo).

Requests arrive at ``timestamp / speed`` after the start, wait in order,
are admitted while fewer than ``max_running`` run and the pool has room
(the first that does not fit waits), decode ``decode_per_step`` tokens a
step up to their ``output_length``, and finish.  A request that cannot grow
is preempted: freed, back to the head of the queue, recomputed later from
its prompt and the tokens it had.  Every action goes through the engine's
queue like any other client.  With ``loop`` the trace starts over when
done (new request ids).

Tokens come from ``blockpool.trace`` (hash id ``h`` at offset ``j``: one
token per ``(h, j)``; outputs unique per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.errors import ApiError, Conflict, InvalidInput
from app.schemas import AdmitOp, AppendOp, FinishOp
from app.workload_task import WorkloadTask
from blockpool.trace import Trace
from blockpool.trace.planner import bound_at

if TYPE_CHECKING:
    from app.engine import Engine

logger = logging.getLogger("blockpool.trace")
STEP_S = 0.05
MAX_TOKEN_ID = 2**31 - 1


@dataclass
class _Live:
    index: int
    rid: str
    prompt: list[int]
    outputs: list[int]
    done: int = 0  # output tokens produced
    admitted: bool = False


@dataclass
class TraceStats:
    arrived: int = 0
    admitted: int = 0
    finished: int = 0
    refused: int = 0  # requests the service refused outright (too long, bad ids)
    preemptions: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    loops: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def check_trace(trace: Trace, max_tokens: int) -> None:
    """Refuse (InvalidInput, nothing loaded) a trace the service cannot replay."""
    top = trace.max_token_id()
    if top > MAX_TOKEN_ID:
        raise InvalidInput(
            f"the trace's token ids reach {top}, above the service's {MAX_TOKEN_ID}",
            max_token_id=top,
        )
    longest = max(r.input_length + r.output_length for r in trace.requests)
    if longest > max_tokens:
        raise InvalidInput(
            f"a request of the trace holds {longest} tokens; this server takes at most "
            f"{max_tokens} per request (max_tokens_per_request)",
            longest=longest,
        )


class TraceDriver(WorkloadTask[_Live]):
    def __init__(self, engine: Engine, speed: float = 1.0, loop: bool = False) -> None:
        super().__init__(engine, "trace-replay")
        self.speed = speed
        self.loop = loop
        self.decode_per_step = 4
        self.max_running = 64
        self.trace: Trace | None = None
        self.name: str | None = None
        self.stats = TraceStats()
        self.pending: deque[int] = deque()
        self.waiting: deque[_Live] = deque()
        self.clock_ms = 0.0
        self.bound: dict[str, Any] | None = None

    # ------------------------------------------------------------- control

    def load(self, trace: Trace, name: str) -> None:
        """Take a validated trace (refused while a replay runs)."""
        if self.running_task:
            raise Conflict("a trace replay is running: stop it first")
        check_trace(trace, self.engine.settings.max_tokens_per_request)
        self.trace, self.name = trace, name
        self._reset()
        self.bound = None
        pool = self.engine.pool
        args = (trace, pool.hash_block_size, pool.num_gpu_blocks)
        threading.Thread(target=self._bound, args=args, daemon=True).start()

    def _bound(self, trace: Trace, block_size: int, num_blocks: int) -> None:
        """LRU against the offline optimum for the what-if panel, off the loop."""
        try:
            bound = bound_at(trace, block_size, num_blocks)
        except Exception:  # a bound is a hint: never the replay's failure
            logger.exception("trace bound")
            return
        if self.trace is trace:
            self.bound = bound

    def _reset(self) -> None:
        self.stats = TraceStats()
        self.pending = deque(range(len(self.trace or ())))
        self.waiting.clear()
        self.clock_ms = 0.0

    def configure(self, speed: float | None = None, loop: bool | None = None) -> None:
        if speed is not None:
            if not 0 < speed <= 10_000:
                raise InvalidInput("speed: need 0 < speed <= 10000", speed=speed)
            self.speed = speed
        if loop is not None:
            self.loop = loop

    def start(self) -> None:
        if self.trace is None:
            raise Conflict("no trace loaded: upload one (POST /api/trace/upload) or serve --trace")
        if not self.running_task:
            if not self.pending and not self.waiting and not self.running:
                self._reset()  # finished: start over
            self._spawn(self._loop)

    async def stop(self, finish_running: bool = True) -> None:
        await self._cancel()
        if finish_running:
            await self._finish_running()

    def status(self) -> dict[str, Any]:
        s = self.stats
        total = len(self.trace) if self.trace is not None else 0
        last = self.trace.requests[-1].timestamp_ms if self.trace is not None else 0.0
        return {
            "loaded": self.trace is not None,
            "name": self.name,
            "running": self.running_task,
            "speed": self.speed,
            "loop": self.loop,
            "requests": total,
            "trace_ms": self.clock_ms,
            "trace_end_ms": last,
            "progress": (s.arrived - s.loops * total) / total if total else 0.0,
            "requests_running": len(self.running),
            "requests_waiting": len(self.waiting),
            "stats": {
                "arrived": s.arrived,
                "admitted": s.admitted,
                "finished": s.finished,
                "refused": s.refused,
                "preemptions": s.preemptions,
                "loops": s.loops,
                "prompt_tokens": s.prompt_tokens,
                "hit_tokens": s.hit_tokens,
                "hit_rate": s.hit_tokens / s.prompt_tokens if s.prompt_tokens else 0.0,
            },
            "bound": self.bound,
        }

    def metrics(self) -> dict[str, float]:
        s = self.stats
        return {
            "running": float(self.running_task),
            "requests_arrived_total": float(s.arrived),
            "hit_tokens_total": float(s.hit_tokens),
            "prompt_tokens_total": float(s.prompt_tokens),
        }

    # ---------------------------------------------------------------- loop

    async def _loop(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(STEP_S)
            now = time.monotonic()
            self.clock_ms += (now - last) * 1000.0 * self.speed
            last = now
            self._arrivals()
            try:
                await self.engine.submit(self._step)
            except ApiError:
                logger.exception("trace step refused")
            if not self.pending and not self.waiting and not self.running:
                if not self.loop:
                    return
                self.stats.loops += 1
                self.pending = deque(range(len(self.trace or ())))
                self.clock_ms = 0.0

    def _arrivals(self) -> None:
        trace = self.trace
        assert trace is not None
        reqs = trace.requests
        while self.pending and reqs[self.pending[0]].timestamp_ms <= self.clock_ms:
            i = self.pending.popleft()
            r = reqs[i]
            self.stats.arrived += 1
            rid = f"trace-{self.stats.loops}-{i}"
            outs = trace.output_token_ids(r)
            self.waiting.append(_Live(i, rid, trace.prompt_token_ids(r), outs))

    def _step(self) -> None:
        """One scheduler step, in the engine's context."""
        engine = self.engine
        before = self.stats.preemptions
        for rid in list(self.running):
            live = self.running.get(rid)
            if live is None:
                continue  # preempted in this step
            n = min(self.decode_per_step, len(live.outputs) - live.done)
            if n > 0 and not self._grow(rid, live, live.outputs[live.done : live.done + n]):
                break  # it was preempted itself: the others wait for the next step
            live.done += n
            if live.done >= len(live.outputs):
                self._finish(rid)
        preempted = self.stats.preemptions != before  # vLLM admits nobody then
        while not preempted and self.waiting and len(self.running) < self.max_running:
            live = self.waiting[0]
            tokens = live.prompt + live.outputs[: live.done]
            try:
                res = engine.apply(AdmitOp(request_id=live.rid, token_ids=tokens))
            except ApiError as exc:
                if exc.code == "not_enough_blocks" and self.running:
                    break  # no room now; try again next step
                self.waiting.popleft()  # it can never be admitted here
                self.stats.refused += 1
                continue
            self.waiting.popleft()
            self.running[live.rid] = live
            if not live.admitted:
                live.admitted = True
                self.stats.admitted += 1
                self.stats.prompt_tokens += len(tokens)
                self.stats.hit_tokens += int(res["num_computed_tokens"])

    def _grow(self, rid: str, live: _Live, toks: list[int]) -> bool:
        """Append ``toks``; when the pool is full, preempt the newest running
        request (vLLM's order) until it fits or is itself preempted."""
        while True:
            try:
                self.engine.apply(AppendOp(request_id=rid, token_ids=toks))
                return True
            except ApiError as exc:
                victim = next(reversed(self.running)) if exc.code == "not_enough_blocks" else rid
                self._preempt(victim, self.running[victim])
                if victim == rid:
                    return False

    def _preempt(self, rid: str, live: _Live) -> None:
        self.running.pop(rid, None)
        with contextlib.suppress(ApiError):
            self.engine.apply(FinishOp(request_id=rid))
        self.stats.preemptions += 1
        self.waiting.appendleft(live)

    def _finish(self, rid: str) -> None:
        self.running.pop(rid, None)
        try:
            self.engine.apply(FinishOp(request_id=rid))
        except ApiError:
            logger.warning("trace request %s could not be finished", rid)
        self.stats.finished += 1
