"""Drive the engine from a production trace at its timestamps (instead of the demo).

Requests arrive at ``timestamp / speed`` after the start, wait in order,
are admitted while fewer than ``max_running`` run and the pool has room
(the first that does not fit waits), decode ``decode_per_step`` tokens a
step up to their ``output_length``, and finish.  A request that cannot grow
is preempted: freed, back to the head of the queue, recomputed later from
its prompt and the tokens it had.  Every action goes through the engine's
queue like any other client.  With ``loop`` the trace starts over when
done (new request ids).

Prompts are prefilled in chunks (vLLM's chunked prefill): an admission
looks up the whole prompt's cached prefix, admits that prefix and the first
``prefill_chunk`` tokens after it, and later engine commands append the
rest a chunk at a time, at most ``step_tokens`` prefill tokens a step.
Each admission, chunk and decode is an engine command of its own, so no
command holds the event loop for long whatever the trace's sizes; the
token lists are built only for the chunk at hand.

Tokens come from ``blockpool.trace`` (hash id ``h`` at offset ``j``: one
token per ``(h, j)``; outputs unique per request).

What an uploaded trace may imply is bounded (:func:`service_limits`,
:func:`check_trace`): requests, tokens a request (the service's
``max_tokens_per_request`` and what the pool can hold), tokens in all, tokens
per id, arrival times; a refusal names the line, the field and the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from app.errors import Conflict, InvalidInput, OperationError
from app.schemas import AdmitOp, AppendOp, FinishOp
from app.workload_task import WorkloadTask
from blockpool.trace import Trace, TraceLimits, TraceRequest
from blockpool.trace.planner import bound_at

if TYPE_CHECKING:
    from app.engine import Engine
    from app.settings import Settings

logger = logging.getLogger("blockpool.trace")
STEP_S = 0.05
MAX_TOKEN_ID = 2**31 - 1
MAX_TOKENS_PER_ID = 65_536
MAX_TIMESTAMP_MS = 30 * 86_400_000.0  # 30 days of trace time
MAX_EXTRA_KEY = 200  # lora_name / cache_salt characters (the admit op's bound)
PREFILL_CHUNK = 256  # tokens a prefill command brings in: its K/V writes take a few ms
STEP_TOKENS = 4096
T = TypeVar("T")


class TraceRefused(InvalidInput, ValueError):
    """A trace the service will not replay (a 422; ``serve --trace``: invalid settings)."""


@dataclass
class _Live:
    index: int
    rid: str
    req: TraceRequest
    done: int = 0  # output tokens produced
    filled: int = 0  # tokens of this admission in the pool
    admitted: bool = False

    @property
    def target(self) -> int:
        """Tokens an admission brings in: the prompt and the outputs so far."""
        return self.req.input_length + self.done


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


def service_limits(settings: Settings) -> TraceLimits:
    """The bounds an uploaded trace is read under."""
    return TraceLimits(
        max_requests=settings.trace_max_requests,
        max_tokens_per_request=settings.max_tokens_per_request,
        max_total_tokens=settings.trace_max_tokens,
        max_tokens_per_id=MAX_TOKENS_PER_ID,
        max_timestamp_ms=MAX_TIMESTAMP_MS,
    )


def _refuse(
    message: str, req: TraceRequest | None, field: str | None, limit: str, **more: Any
) -> None:
    line = req.line if req is not None else 0
    where = f"line {line}: " if line else ""
    raise TraceRefused(f"{where}{message}", line=line, field=field, limit=limit, **more)


def check_trace(trace: Trace, settings: Settings) -> None:
    """Refuse (TraceRefused, nothing loaded) a trace the service cannot replay:
    every request must fit a request's limit and the pool, the whole within
    the service's bounds, its token ids within the service's range."""
    limits = service_limits(settings)
    reqs = trace.requests
    if len(reqs) > limits.max_requests:
        _refuse(
            f"the trace holds {len(reqs)} requests; this server takes at most "
            f"{limits.max_requests} (trace_max_requests)",
            reqs[limits.max_requests], None, "trace_max_requests",
        )  # fmt: skip
    if trace.tokens_per_id > limits.max_tokens_per_id:
        _refuse(
            f"tokens per id {trace.tokens_per_id} is over this server's limit of "
            f"{limits.max_tokens_per_id} (max_tokens_per_id)",
            None, "tokens_per_id", "max_tokens_per_id",
        )  # fmt: skip
    cap = settings.max_tokens_per_request
    bs, groups = settings.block_size, settings.num_groups
    usable = settings.effective_num_blocks - 1
    total = 0
    for r in reqs:
        n = r.input_length + r.output_length
        if n > cap:
            _refuse(
                f"a request of the trace holds {n} tokens; this server takes at most {cap} per "
                "request (max_tokens_per_request)",
                r, "input_length", "max_tokens_per_request", longest=n,
            )  # fmt: skip
        need = -(-n // bs) * groups
        if need > usable:
            _refuse(
                f"a request of the trace needs {need} blocks for its {n} tokens; the pool holds "
                f"{usable} besides the null block (num_blocks)",
                r, "input_length", "num_blocks", blocks=need, pool_blocks=usable,
            )  # fmt: skip
        if r.timestamp_ms > limits.max_timestamp_ms:
            _refuse(
                f"an arrival at {r.timestamp_ms:g} ms is past this server's limit of "
                f"{limits.max_timestamp_ms:g} ms (max_timestamp_ms)",
                r, "timestamp", "max_timestamp_ms",
            )  # fmt: skip
        for key in ("lora_name", "cache_salt"):
            v = getattr(r, key)
            if v is not None and not 1 <= len(v) <= MAX_EXTRA_KEY:
                _refuse(f"{key} must hold 1..{MAX_EXTRA_KEY} characters", r, key, key)
        total += n
        if total > limits.max_total_tokens:
            _refuse(
                f"the trace's requests hold more than {limits.max_total_tokens} tokens in all; "
                "this server takes at most that (trace_max_tokens)",
                r, "input_length", "trace_max_tokens",
            )  # fmt: skip
    top = trace.max_token_id()
    if top > MAX_TOKEN_ID:
        _refuse(
            f"the trace's token ids reach {top}, above the service's {MAX_TOKEN_ID}",
            None, "hash_ids", "max_token_id", max_token_id=top,
        )  # fmt: skip


class TraceDriver(WorkloadTask[_Live]):
    def __init__(self, engine: Engine, speed: float = 1.0, loop: bool = False) -> None:
        super().__init__(engine, "trace-replay")
        self.speed = speed
        self.loop = loop
        self.decode_per_step = 4
        self.max_running = 64
        self.prefill_chunk = PREFILL_CHUNK
        self.step_tokens = STEP_TOKENS
        self.trace: Trace | None = None
        self.name: str | None = None
        self.stats = TraceStats()
        self.pending: deque[int] = deque()
        self.waiting: deque[_Live] = deque()
        self.clock_ms = 0.0
        # (request id, free blocks it lacked): not tried again until more are free
        self._blocked: tuple[str, int] | None = None
        self.bound: dict[str, Any] | None = None

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

    def ensure_startable(self) -> None:
        if self.trace is None:
            raise Conflict("no trace loaded: upload one (POST /api/trace/upload) or serve --trace")
        super().ensure_startable()

    def start(self) -> None:
        self.ensure_startable()
        if not self.running_task:
            idle = not self.pending and not self.waiting and not self.running
            self._spawn(self._loop)  # a 409 when another workload runs
            if idle:
                self._reset()  # finished: start over

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
            await self._step()
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
            self.stats.arrived += 1
            self.waiting.append(_Live(i, f"trace-{self.stats.loops}-{i}", reqs[i]))

    async def _run(self, fn: Callable[[], T]) -> T | None:
        """One engine command; None when the engine refused it."""
        try:
            result: T = await self.engine.submit(fn)
        except OperationError:
            logger.exception("trace step refused")
            return None
        return result

    async def _step(self) -> None:
        """One scheduler step: each a command of its own, decodes (oldest
        first), then prefill chunks of the requests being admitted, then
        admissions, within ``step_tokens`` prefill tokens."""
        before = self.stats.preemptions
        for rid in list(self.running):
            live = self.running.get(rid)
            if live is None or live.filled < live.target:
                continue  # preempted in this step, or still prefilling
            if not await self._run(partial(self._decode, rid, live)):
                break  # it was preempted itself: the others wait for the next step
        if self.stats.preemptions != before:
            return  # vLLM admits nobody then
        budget = self.step_tokens
        for rid in list(self.running):
            live = self.running.get(rid)
            if live is None or live.filled >= live.target:
                continue
            if budget <= 0:
                return
            n = min(self.prefill_chunk, live.target - live.filled, budget)
            budget -= n
            if not await self._run(partial(self._prefill, rid, live, n)):
                return  # preempted
        if self.stats.preemptions != before:
            return  # a prefill preempted another: no admissions in this step either
        while budget > 0 and self.waiting and len(self.running) < self.max_running:
            used = await self._run(partial(self._admit, budget))
            if not used:
                return
            budget -= used

    def _tokens(self, live: _Live, start: int, stop: int) -> list[int]:
        """Tokens ``[start:stop]`` of the request's prompt and outputs (only those built)."""
        trace = self.trace
        assert trace is not None
        req = live.req
        n = req.input_length
        out = trace.prompt_token_ids(req, start, stop) if start < n else []
        if stop > n:
            out += trace.output_token_ids(req, max(start - n, 0), stop - n)
        return out

    def _decode(self, rid: str, live: _Live) -> bool:
        """Decode one step of ``rid`` (engine context); False when it was preempted."""
        n = min(self.decode_per_step, live.req.output_length - live.done)
        if n > 0:
            toks = self._tokens(live, live.target, live.target + n)
            if not self._grow(rid, live, toks):
                return False
            live.done += n
            live.filled += n
        if live.done >= live.req.output_length:
            self._finish(rid)
        return True

    def _prefill(self, rid: str, live: _Live, n: int) -> bool:
        """The next ``n`` tokens of an admission (engine context); False when preempted."""
        if self.running.get(rid) is not live:
            return True  # preempted since the step planned it
        if not self._grow(rid, live, self._tokens(live, live.filled, live.filled + n)):
            return False
        live.filled += n
        return True

    def _admit(self, budget: int) -> int:
        """Admit the first waiting request, its cached prefix and a first chunk
        (engine context); the prefill tokens it took, 0 when none was admitted."""
        engine = self.engine
        while self.waiting:
            live = self.waiting[0]
            req = live.req
            blocked = self._blocked
            if (
                blocked is not None
                and blocked[0] == live.rid
                and engine.pool.get_num_free_blocks() < blocked[1]
            ):
                return 0  # nothing freed since it did not fit: it would not now
            self._blocked = None
            target = live.target
            chunk = min(self.prefill_chunk, budget)
            if target <= chunk:
                tokens = self._tokens(live, 0, target)
            else:  # the whole prompt's cached prefix, then a chunk past it
                hit = self._cached_prefix(live, target)
                tokens = self._tokens(live, 0, hit + min(chunk, target - hit))
            op = AdmitOp(
                request_id=live.rid,
                token_ids=tokens,
                lora_name=req.lora_name,
                cache_salt=req.cache_salt,
            )
            try:
                res = engine.apply(op)
            except OperationError as exc:
                if exc.code == "not_enough_blocks" and self.running:
                    self._blocked = (live.rid, int(exc.details.get("requested", 0)))
                    return 0  # no room now; try again once blocks are freed
                self.waiting.popleft()  # it can never be admitted here
                self.stats.refused += 1
                continue
            self.waiting.popleft()
            live.filled = len(tokens)
            self.running[live.rid] = live
            hit = int(res["num_computed_tokens"])
            if not live.admitted:
                live.admitted = True
                self.stats.admitted += 1
                self.stats.prompt_tokens += target
                self.stats.hit_tokens += hit
            return max(len(tokens) - hit, 1)
        return 0

    def _cached_prefix(self, live: _Live, target: int) -> int:
        """The cached prefix (tokens) of the request's first ``target`` tokens,
        as one lookup of them all finds it, hashing little more than it: a
        prefix's hits are the whole's up to the prefix's cap, so prefixes
        twice as long each time are looked up until one misses before its cap."""
        manager = self.engine.manager
        bs = manager.block_size
        req = live.req
        m = min(target, 2 * max(self.prefill_chunk, bs))
        while True:
            toks = self._tokens(live, 0, m)
            hit = manager.lookup(toks, lora_name=req.lora_name, cache_salt=req.cache_salt)
            if m >= target or hit < (m - 1) // bs * bs:
                return hit
            m = min(target, 2 * m)

    def _grow(self, rid: str, live: _Live, toks: list[int]) -> bool:
        """Append ``toks``; when the pool is full, preempt the newest running
        request (vLLM's order) until it fits or is itself preempted."""
        while True:
            try:
                self.engine.apply(AppendOp(request_id=rid, token_ids=toks))
                return True
            except OperationError as exc:
                victim = next(reversed(self.running)) if exc.code == "not_enough_blocks" else rid
                self._preempt(victim, self.running[victim])
                if victim == rid:
                    return False

    def _preempt(self, rid: str, live: _Live) -> None:
        self.running.pop(rid, None)
        with contextlib.suppress(OperationError):
            self.engine.apply(FinishOp(request_id=rid))
        self.stats.preemptions += 1
        live.filled = 0
        self.waiting.appendleft(live)

    def _finish(self, rid: str) -> None:
        self.running.pop(rid, None)
        try:
            self.engine.apply(FinishOp(request_id=rid))
        except OperationError:
            logger.warning("trace request %s could not be finished", rid)
        self.stats.finished += 1
