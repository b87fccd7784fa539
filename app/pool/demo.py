"""The demo workload: realistic request streams driven through the engine.

Four kinds of traffic, mixed by weight:

- chat: one of a few shared system prompts + a short user message;
- conversation: multi-turn chats whose prompt is the whole history so far,
  so each turn re-uses the previous turn's prefix;
- document: one of a few long shared documents + a short question;
- noise: random prompts that share nothing.

Requests arrive as a Poisson process at ``rate`` per second, decode at
``decode_per_step`` tokens per STEP_S of wall time (a step that came late
decodes more: a busy machine slows the pool's operations, not the
workload's service rate, so the default load holds steady however loaded
the machine is), and finish; when the pool is full, arrivals wait (vLLM's
scheduler would queue them) and the oldest waiting ones go first; past
``max_waiting`` the oldest are dropped (counted in ``dropped_waiting`` and
shown on the page).  Every action goes through the engine's queue like any
other client.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.pool.schemas import AdmitOp, AppendOp, FinishOp
from app.pool.workload_task import WorkloadTask
from app.shared.errors import OperationError
from blockpool.common.figures import Figures, counter, helps, rest_view, totals

if TYPE_CHECKING:
    from app.pool.engine import Engine

logger = logging.getLogger("blockpool.demo")
VOCAB = 32000
STEP_S = 0.05
MAX_CATCH_UP = 8  # a late step decodes at most this many steps' tokens
KINDS = ("chat", "conversation", "document", "noise")


@dataclass
class DemoRequest:
    request_id: str
    kind: str
    prompt: list[int]
    decode_left: int
    conversation: int | None = None
    output: list[int] = field(default_factory=list)


@dataclass
class DemoStats:
    arrived: int = counter("Requests the demo workload generated.", metric="requests_arrived_total")
    admitted: int = counter("Demo requests admitted.", metric=None)
    finished: int = counter("Demo requests finished.", metric=None)
    refused: int = counter(
        "Demo admissions refused for lack of blocks (retried).",
        rest="refused_for_space",
        metric=None,
    )
    waiting_peak: int = counter("The most demo requests waiting at once.", metric=None)
    dropped_waiting: int = counter(
        "Demo requests dropped because the waiting queue was full.",
        metric="dropped_waiting_total",
    )


DEMO_HELP = {
    **helps(DemoStats),
    "running": "1 while the demo workload runs.",
    "requests_waiting": "Demo requests waiting for blocks.",
}


class DemoWorkload(WorkloadTask["DemoRequest", dict[str, Any]]):
    def __init__(self, engine: Engine, rate: float = 8.0, seed: int = 0) -> None:
        super().__init__(engine, "demo-workload")
        self.rate = rate
        self.mix: dict[str, float] = {"chat": 4, "conversation": 3, "document": 2, "noise": 1}
        self.decode_tokens = (16, 160)
        self.decode_per_step = 4
        self.max_running = 64
        self.max_waiting = 256
        self.rng = random.Random(seed)
        r = self.rng
        self.system_prompts = [self._tokens(r.randint(150, 600)) for _ in range(4)]
        self.documents = [self._tokens(r.randint(800, 2500)) for _ in range(8)]
        self.conversations: list[list[int]] = [[] for _ in range(24)]
        self.busy_conversations: set[int] = set()
        self.waiting: deque[DemoRequest] = deque()
        self.stats = DemoStats()
        self.figures = Figures(self.metrics, DEMO_HELP)
        self._seq = 0
        self._carry = 0.0  # the arrivals' fraction carried to the next step

    # ------------------------------------------------------------- control

    def start(self) -> None:
        self._spawn(self._loop)

    async def stop(self, finish_running: bool = True) -> None:
        await self._cancel()
        self.waiting.clear()
        if finish_running and self.running:
            self.busy_conversations.clear()
            await self._finish_running()

    def configure(self, **changes: Any) -> None:
        """Apply the given settings, all or none: every value is checked first."""
        from app.shared.errors import InvalidInput

        rate, mix, decode, max_running = self.rate, self.mix, self.decode_tokens, self.max_running
        if changes.get("rate") is not None:
            rate = float(changes["rate"])
        if changes.get("mix") is not None:
            weights = {k: float(v) for k, v in changes["mix"].items()}
            unknown = set(weights) - set(KINDS)
            if unknown or any(v < 0 for v in weights.values()) or not any(weights.values()):
                raise InvalidInput(
                    f"mix: weights for {', '.join(KINDS)} (non-negative, not all 0)",
                    unknown=sorted(unknown),
                )
            mix = {k: weights.get(k, 0.0) for k in KINDS}
        if changes.get("decode_tokens") is not None:
            lo, hi = changes["decode_tokens"]
            if not 1 <= lo <= hi <= 100_000:
                raise InvalidInput("decode_tokens: need 1 <= min <= max <= 100000")
            decode = (int(lo), int(hi))
        if changes.get("max_running") is not None:
            max_running = int(changes["max_running"])
        self.rate, self.mix, self.decode_tokens, self.max_running = rate, mix, decode, max_running

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {
            "running": self.running_task,
            "rate": self.rate,
            "mix": self.mix,
            "decode_tokens": list(self.decode_tokens),
            "max_running": self.max_running,
            "max_waiting": self.max_waiting,
            "requests_running": len(self.running),
            "requests_waiting": len(self.waiting),
            "stats": rest_view(s),
        }

    def metrics(self) -> dict[str, float]:
        return {
            "running": float(self.running_task),
            "requests_waiting": float(len(self.waiting)),
            **{k: float(v) for k, v in totals(self.stats).items()},
        }

    # ------------------------------------------------------------ requests

    def _tokens(self, n: int) -> list[int]:
        r = self.rng
        return [r.randrange(VOCAB) for _ in range(n)]

    def _new_request(self) -> DemoRequest:
        kinds = list(self.mix)
        kind = self.rng.choices(kinds, [self.mix[k] for k in kinds])[0]
        conv = None
        if kind == "chat":
            prompt = self.rng.choice(self.system_prompts) + self._tokens(self.rng.randint(20, 200))
        elif kind == "document":
            prompt = self.rng.choice(self.documents) + self._tokens(self.rng.randint(10, 60))
        elif kind == "conversation":
            free = [i for i in range(len(self.conversations)) if i not in self.busy_conversations]
            if not free:
                kind, prompt = "noise", self._tokens(self.rng.randint(100, 1000))
            else:
                conv = self.rng.choice(free)
                history = self.conversations[conv]
                if len(history) > 6000:  # a long conversation ends; a new one starts
                    history.clear()
                if not history:
                    history.extend(self.rng.choice(self.system_prompts))
                history.extend(self._tokens(self.rng.randint(20, 120)))
                prompt = list(history)
                self.busy_conversations.add(conv)
        else:
            prompt = self._tokens(self.rng.randint(100, 1000))
        self._seq += 1
        lo, hi = self.decode_tokens
        return DemoRequest(f"demo-{self._seq}", kind, prompt, self.rng.randint(lo, hi), conv)

    # ---------------------------------------------------------------- loop

    async def _loop(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(STEP_S)
            now = time.monotonic()
            dt, last = now - last, now
            self.arrive(dt)
            per = self.step_tokens(dt)
            try:
                await self.engine.submit(functools.partial(self._step, per))
            except OperationError:
                logger.exception("demo step refused")

    def arrive(self, dt: float) -> None:
        """The arrivals of ``dt`` seconds into the waiting queue (the oldest
        dropped past ``max_waiting``)."""
        self._carry += self.rate * dt
        arrivals = 0
        # Poisson-ish: the expected count, with the fraction drawn.
        while self._carry >= 1.0:
            arrivals += 1
            self._carry -= 1.0
        if self.rng.random() < self._carry:
            arrivals += 1
            self._carry = 0.0
        for _ in range(arrivals):
            self.stats.arrived += 1
            self.waiting.append(self._new_request())
        while len(self.waiting) > self.max_waiting:
            req = self.waiting.popleft()
            self._release_conversation(req)
            self.stats.dropped_waiting += 1
        self.stats.waiting_peak = max(self.stats.waiting_peak, len(self.waiting))

    def step_tokens(self, dt: float) -> int:
        """Tokens each running request decodes in a step that came ``dt``
        seconds after the last: ``decode_per_step`` per STEP_S of wall time."""
        steps = min(float(MAX_CATCH_UP), max(1.0, dt / STEP_S))
        return max(1, round(self.decode_per_step * steps))

    def _release_conversation(self, req: DemoRequest) -> None:
        if req.conversation is not None:
            self.busy_conversations.discard(req.conversation)

    def _step(self, per: int | None = None) -> None:
        """One scheduler step, in the engine's context: each running request
        decodes ``per`` tokens (``decode_per_step`` by default)."""
        engine = self.engine
        per = self.decode_per_step if per is None else per
        for rid, req in list(self.running.items()):
            n = min(per, req.decode_left)
            toks = self._tokens(n)
            try:
                engine.apply(AppendOp(request_id=rid, token_ids=toks))
            except OperationError:
                # No room to grow: preempt (finish) it; it will not come back.
                self._finish(rid, req)
                continue
            req.output.extend(toks)
            req.decode_left -= n
            if req.decode_left <= 0:
                self._finish(rid, req)
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            try:
                engine.apply(AdmitOp(request_id=req.request_id, token_ids=req.prompt))
            except OperationError:
                self.stats.refused += 1
                break  # no room now; try again next step
            self.waiting.popleft()
            self.running[req.request_id] = req
            self.stats.admitted += 1

    def _finish(self, rid: str, req: DemoRequest) -> None:
        self.running.pop(rid, None)
        try:
            self.engine.apply(FinishOp(request_id=rid))
        except OperationError:
            logger.warning("demo request %s could not be finished", rid)
        if req.conversation is not None:
            self.conversations[req.conversation].extend(req.output)
            self._release_conversation(req)
        self.stats.finished += 1
