"""Timed mode: arrivals at their timestamps, decode, a scheduler above the pool.

Two schedulers.  ``TimedConfig(scheduler=SchedulerConfig(...))`` runs vLLM
0.16's v1 scheduler with its token budget, chunked prefill, asynchronous
scheduling, ``max_model_len`` and policies (``scheduler.py``, ``engine.py``,
``scheduled.py``).  Without one, the simple scheduler below: a step-based
simulation of vLLM 0.16's scheduler with those features off (FCFS, no
chunked prefill, no token budget), on simulated time: arrivals at ``timestamp / speed`` ms,
one step every ``step_ms``.  Each step:

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

The pool side is a :class:`Backend`; :class:`ManagerBackend` runs the
library's :class:`~blockpool.manager.RequestManager`.  No one-pass shortcut
applies here: blocks are held across requests, so each capacity is its own
replay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from blockpool.errors import NotEnoughBlocksError
from blockpool.hashing import HashFn, maybe_convert_block_hash
from blockpool.manager import RequestManager
from blockpool.trace.engine import StepModel
from blockpool.trace.reader import Trace, TraceRequest
from blockpool.trace.results import CapacityResult, capacity_blocks
from blockpool.trace.scheduled import replay_scheduled
from blockpool.trace.scheduler import SchedulerConfig
from blockpool.trace.sequence import make_pool, unbounded_blocks


class Backend(Protocol):
    """The request-level calls a timed replay makes."""

    def admit(self, rid: str, tokens: list[int], req: TraceRequest, first: bool) -> int | None:
        """Hit tokens, or None (nothing changed) when the blocks are lacking.
        ``first``: False when readmitting a preempted request."""

    def append(self, rid: str, token: int) -> bool:
        """Room for one more token; False (nothing changed) when lacking."""

    def finish(self, rid: str) -> None: ...


class ManagerBackend:
    """Timed replays on a RequestManager; evictions and miss reasons come
    from the pool's events."""

    def __init__(self, manager: RequestManager, result: CapacityResult) -> None:
        self.manager = manager
        self.pool = manager.pool
        self.result = result
        self.cached: dict[int | bytes, int] = {}  # event hash -> copies cached
        self.stored: set[int | bytes] = set()

    def _drain(self) -> tuple[list[int | bytes], list[int | bytes]]:
        stored: list[int | bytes] = []
        removed: list[int | bytes] = []
        for ev in self.pool.take_events():
            name = ev.__class__.__name__
            if name == "BlockStored":
                stored.extend(ev.block_hashes)  # type: ignore[attr-defined]
            elif name == "BlockRemoved":
                removed.extend(ev.block_hashes)  # type: ignore[attr-defined]
        cached = self.cached
        for h in removed:
            n = cached[h] - 1
            if n:
                cached[h] = n
            else:
                del cached[h]
        for h in stored:
            cached[h] = cached.get(h, 0) + 1
        self.result.evictions += len(removed)
        return stored, removed

    def admit(self, rid: str, tokens: list[int], req: TraceRequest, first: bool) -> int | None:
        try:
            adm = self.manager.admit(
                rid, tokens, lora_name=req.lora_name, cache_salt=req.cache_salt
            )
        except NotEnoughBlocksError:
            return None
        stored, removed = self._drain()
        if first:
            self._reasons(rid, len(tokens), adm.num_hit_blocks, stored, removed)
        self.stored.update(stored)
        return adm.num_computed_tokens

    def _reasons(
        self,
        rid: str,
        num_tokens: int,
        k: int,
        stored: list[int | bytes],
        removed: list[int | bytes],
    ) -> None:
        bs = self.manager.block_size
        hashes = [maybe_convert_block_hash(h) for h in self.manager.block_hashes_of(rid)]
        num_full = min(num_tokens // bs, len(hashes))
        max_hit = min((num_tokens - 1) // bs, num_full)
        lo, hi = k, num_full  # stored hashes are a prefix of the chain
        while lo < hi:
            mid = (lo + hi) // 2
            if hashes[mid] in self.stored:
                lo = mid + 1
            else:
                hi = mid
        seen = lo
        last_token = 0
        if max_hit < num_full and k == max_hit:
            h = hashes[max_hit]
            before = self.cached.get(h, 0) - stored.count(h) + removed.count(h)
            last_token = 1 if before > 0 else 0
        r = self.result.miss_reasons
        r["last_token"] += last_token
        r["block_size_floor"] += 1 if num_tokens % bs else 0
        r["evicted"] += seen - k - last_token
        r["cold"] += num_full - seen
        self.result.regret_blocks += seen - k - last_token

    def append(self, rid: str, token: int) -> bool:
        try:
            self.manager.append_tokens(rid, [token])
        except NotEnoughBlocksError:
            return False
        self.stored.update(self._drain()[0])
        return True

    def finish(self, rid: str) -> None:
        self.manager.finish(rid)


@dataclass
class TimedConfig:
    """``scheduler``: vLLM's scheduler with these settings (None: the simple
    one); ``step_model``: its step times (None: ``step_ms`` a step)."""

    speed: float = 1.0
    step_ms: float = 20.0
    max_running: int = 256
    scheduler: SchedulerConfig | None = None
    step_model: StepModel | None = None

    def __post_init__(self) -> None:
        if not self.speed > 0 or not self.step_ms > 0 or self.max_running < 1:
            raise ValueError("speed and step_ms must be > 0, max_running >= 1")


class _Live:
    __slots__ = ("n", "outputs", "prompt", "req", "rid", "sampled")

    def __init__(self, req: TraceRequest, prompt: list[int], outputs: list[int]) -> None:
        self.req = req
        self.rid = str(req.index)
        self.prompt = prompt
        self.outputs = outputs
        self.n = max(len(outputs), 1)  # tokens to sample
        self.sampled = 0


def run_timed(
    trace: Trace,
    backend: Backend,
    result: CapacityResult,
    usable_blocks: int | None,
    block_size: int,
    config: TimedConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CapacityResult:
    """Replay ``trace`` in timed mode through ``backend``."""
    cfg = config or TimedConfig()
    reqs = trace.requests
    arrivals = deque(reqs)
    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    clock = 0.0
    done = steps = 0
    frees = 0  # finishes so far: a refused admission is retried only after one
    blocked_at = -1
    total = len(reqs)
    while arrivals or waiting or running:
        if not waiting and not running:
            clock = max(clock, arrivals[0].timestamp_ms / cfg.speed)
        while arrivals and arrivals[0].timestamp_ms / cfg.speed <= clock:
            req = arrivals.popleft()
            result.prompt_tokens += req.input_length
            need = -(-(req.input_length + max(req.output_length, 1) - 1) // block_size)
            if usable_blocks is not None and need > usable_blocks:
                result.refused += 1
                result.refused_tokens += req.input_length
                done += 1
                continue
            waiting.append(_Live(req, trace.prompt_token_ids(req), trace.output_token_ids(req)))
        steps += 1
        preempted = False
        i = 0
        while i < len(running):
            live = running[i]
            if live.sampled >= live.n:
                i += 1
                continue
            while not backend.append(live.rid, live.outputs[live.sampled - 1]):
                victim = running.pop()
                backend.finish(victim.rid)
                frees += 1
                waiting.appendleft(victim)
                result.preemptions += 1
                preempted = True
                if victim is live:
                    break
            else:
                live.sampled += 1
                i += 1
                continue
            break
        if not preempted and blocked_at != frees:
            blocked_at = -1
            while waiting and len(running) < cfg.max_running:
                live = waiting[0]
                first = live.sampled == 0
                tokens = live.prompt if first else live.prompt + live.outputs[: live.sampled]
                hit = backend.admit(live.rid, tokens, live.req, first)
                if hit is None:
                    # Until blocks are freed, free blocks only shrink and the
                    # need only grows: every retry would fail the same way.
                    blocked_at = frees
                    break
                waiting.popleft()
                if first:
                    result.admitted += 1
                    result.hit_tokens += hit
                else:
                    result.extra["recompute_tokens"] = result.extra.get(
                        "recompute_tokens", 0
                    ) + len(tokens)
                    result.extra["recompute_hit_tokens"] = (
                        result.extra.get("recompute_hit_tokens", 0) + hit
                    )
                live.sampled += 1
                running.append(live)
        still = []
        for live in running:
            if live.sampled >= live.n:
                backend.finish(live.rid)
                frees += 1
                done += 1
            else:
                still.append(live)
        running = still
        clock += cfg.step_ms
        if progress is not None and steps & 255 == 0:
            progress(done, total)
    result.extra["steps"] = steps
    result.extra["simulated_seconds"] = clock / 1000.0
    if progress is not None:
        progress(total, total)
    return result


def replay_timed(
    trace: Trace,
    block_size: int,
    capacities_tokens: Sequence[int | None],
    hash_fn: HashFn,
    free_order: str = "append_all",
    config: TimedConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[CapacityResult]:
    """Timed mode on a RequestManager per capacity (one replay each), or
    through vLLM's scheduler model when ``config.scheduler`` is set."""
    cfg = config or TimedConfig()
    if cfg.scheduler is not None:
        model = cfg.step_model or StepModel(cfg.step_ms)
        return replay_scheduled(
            trace,
            block_size,
            capacities_tokens,
            hash_fn,
            free_order,
            cfg.scheduler,
            model,
            cfg.speed,
            progress,
        )
    out = []
    for cap in capacities_tokens:
        blocks = capacity_blocks(cap, block_size)
        if blocks is not None and blocks < 1:
            raise ValueError(f"{cap} tokens hold no block of {block_size} tokens")
        n = (
            blocks
            if blocks is not None
            else unbounded_blocks(trace, block_size)
            + sum(-(-r.output_length // block_size) for r in trace.requests)
        )
        pool = make_pool(n, block_size, free_order)
        result = CapacityResult(cap, blocks)
        backend = ManagerBackend(RequestManager(pool, hash_fn=hash_fn), result)
        usable = None if blocks is None else n - 1
        run_timed(trace, backend, result, usable, block_size, config, progress)
        out.append(result)
    return out
