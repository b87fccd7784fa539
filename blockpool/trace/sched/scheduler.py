"""vLLM 0.16's v1 ``Scheduler`` for one full-attention group, on a BlockPool.

The scheduling step of ``vllm/v1/core/sched/scheduler.py`` (and the
``AsyncScheduler`` subclass) with no speculative decoding, encoder inputs,
KV connector, LoRA limit or structured output:

1. running requests in order, while tokens are left in the step's budget
   (``max_num_batched_tokens``): each gets ``num_tokens + placeholders -
   num_computed`` new tokens, at most ``long_prefill_token_threshold`` (when
   > 0), the budget left and ``max_model_len - 1 - num_computed``; when its
   slots cannot be allocated the lowest-priority running request is
   preempted (FCFS: the newest; priority: the largest ``(priority,
   arrival)``) -- its blocks freed, back at the head of the waiting queue,
   recomputed from its prompt and outputs -- until the request fits or is
   itself preempted (then the running pass stops);
2. unless something was preempted, waiting requests in queue order while
   budget is left and fewer than ``max_num_seqs`` run: the cached prefix is
   looked up (``KVSlots.lookup``: counted every time), the first chunk is
   ``num_tokens - hit`` capped by the threshold and the budget (without
   chunked prefill a prompt that does not fit the budget left stops
   admission); a request whose slots cannot be allocated stops admission;
3. every scheduled request's ``num_computed`` advances by its tokens; one
   that has caught up with its tokens samples one (asynchronous scheduling:
   it gets an output placeholder at once and can be scheduled again before
   the token is known).

``update`` applies a step's sampled tokens: each is appended (asynchronous
scheduling: then its full blocks are cached), and a request that has its
``max_tokens`` outputs or reaches ``max_model_len`` tokens finishes and frees
its blocks.  A request whose prompt has ``max_model_len`` tokens or more is
rejected before it gets here (vLLM's input processor does that).

A request as it holds one, and its waiting queues:
blockpool/trace/sched/sched_request.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from blockpool.trace.sched.sched_request import (
    FINISHED,
    PREEMPTED,
    RUNNING,
    FcfsQueue,
    PriorityQueue,
    SchedRequest,
)
from blockpool.trace.sched.slots import SlotBackend

Policy = Literal["fcfs", "priority"]
POLICIES: tuple[str, ...] = get_args(Policy)
UNBOUNDED = 1 << 62


@dataclass
class SchedulerConfig:
    """vLLM's scheduler settings (its names); ``None``/0 turns a limit off."""

    max_num_batched_tokens: int | None = 8192
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    max_model_len: int | None = None
    policy: str = "fcfs"
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1 (or None: no budget)")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2 (or None: no limit)")
        b, m = self.max_num_batched_tokens, self.max_model_len
        if b is not None and not self.enable_chunked_prefill and m is not None and b < m:
            raise ValueError(
                f"max_num_batched_tokens ({b}) is smaller than max_model_len ({m}) without "
                "chunked prefill: longer prompts could never run (vLLM refuses this too)"
            )
        if b is not None and b < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({b}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r} (known: {', '.join(POLICIES)})")

    @property
    def budget(self) -> int:
        return UNBOUNDED if self.max_num_batched_tokens is None else self.max_num_batched_tokens

    @property
    def model_len(self) -> int:
        return UNBOUNDED if self.max_model_len is None else self.max_model_len


@dataclass
class StepPlan:
    """What one ``schedule`` call scheduled."""

    num_scheduled: dict[str, int]
    sampling: list[SchedRequest]
    preempted: list[SchedRequest]
    prefill_tokens: int
    decode_seqs: int

    @property
    def total_tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs


class Scheduler:
    """The scheduler above a :class:`~blockpool.trace.sched.slots.SlotBackend`
    (``KVSlots``); driven by ``add``, ``schedule`` and ``update`` (an
    :class:`~blockpool.trace.sched.engine_core.SimulatedEngineCore` does that as vLLM's engine core
    does; a live driver can call ``SimulatedEngineCore.step`` at its own pace)."""

    def __init__(self, slots: SlotBackend, config: SchedulerConfig) -> None:
        self.slots = slots
        self.config = config
        self.requests: dict[str, SchedRequest] = {}
        self.waiting: FcfsQueue | PriorityQueue = (
            PriorityQueue() if config.policy == "priority" else FcfsQueue()
        )
        self.running: list[SchedRequest] = []
        self.finished_since_schedule = 0
        self.preemptions = 0
        self._budget = config.budget
        self._model_len = config.model_len
        self._threshold = config.long_prefill_token_threshold
        self._async = config.async_scheduling

    # ------------------------------------------------------------ queries

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def has_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running) or self.finished_since_schedule > 0

    # ------------------------------------------------------------ steps

    def add(self, r: SchedRequest) -> None:
        self.requests[r.rid] = r
        self.waiting.add(r)

    def _preempt(self, r: SchedRequest) -> None:
        self.slots.free(r)
        r.status = PREEMPTED
        r.num_computed = 0
        r.num_preemptions += 1
        self.preemptions += 1
        self.waiting.prepend(r)

    def requeue(self, r: SchedRequest) -> None:
        """Give a request's blocks back and put it at the head of the queue,
        recomputed when scheduled again (a paused live replay, a request its
        runtime lost): not a preemption."""
        if r.status != RUNNING:
            return
        self.running.remove(r)
        self.slots.free(r)
        r.status = PREEMPTED
        r.num_computed = 0
        self.waiting.prepend(r)

    def drop(self, r: SchedRequest) -> None:
        """Forget a waiting request (its runtime refused it for good)."""
        self.waiting.remove([r])
        self.requests.pop(r.rid, None)

    def schedule(self, now_ms: float = 0.0) -> StepPlan:
        slots = self.slots
        allocate = slots.allocate
        running = self.running
        budget = self._budget
        threshold = self._threshold
        model_len = self._model_len
        priority = self.config.policy == "priority"
        num_sched: dict[str, int] = {}
        scheduled_running: list[SchedRequest] = []
        preempted: list[SchedRequest] = []
        prefill = decode = 0

        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            if (
                r.placeholders > 0
                and r.num_computed + 2 - r.placeholders >= r.req.num_prompt_tokens + r.max_tokens
            ):
                i += 1
                continue
            n = r.req.num_tokens + r.placeholders - r.num_computed
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            cap = model_len - 1 - r.num_computed
            if n > cap:
                n = cap
            if n == 0:
                i += 1
                continue
            ok = allocate(r, n)
            while not ok:
                if priority:
                    victim = max(running, key=lambda x: (x.priority, x.arrival_ms))
                    running.remove(victim)
                    if victim in scheduled_running:
                        scheduled_running.remove(victim)
                        budget += num_sched.pop(victim.rid)
                        i -= 1
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is r:
                    break
                ok = allocate(r, n)
            if not ok:
                break
            scheduled_running.append(r)
            num_sched[r.rid] = n
            budget -= n
            i += 1

        if not preempted:
            waiting = self.waiting
            max_seqs = self.config.max_num_seqs
            chunked = self.config.enable_chunked_prefill
            counts = slots.counts_misses
            while waiting and budget > 0:
                if len(running) == max_seqs:
                    break
                r = waiting.peek()
                hit, num_hit = slots.lookup(r)
                n = r.req.num_tokens - num_hit
                if 0 < threshold < n:
                    n = threshold
                if not chunked and n > budget:
                    break
                if n > budget:
                    n = budget
                first = r.num_cached_tokens < 0
                if first and counts:
                    misses = slots.misses(r, num_hit)
                if not allocate(r, n, num_hit, hit):
                    break
                waiting.pop()
                running.append(r)
                num_sched[r.rid] = n
                budget -= n
                r.status = RUNNING
                r.num_computed = num_hit
                if first:
                    r.num_cached_tokens = num_hit
                    if counts:
                        slots.add_misses(misses)
                if r.first_sched_ms < 0:
                    r.first_sched_ms = now_ms

        sampling: list[SchedRequest] = []
        requests = self.requests
        for rid, n in num_sched.items():
            r = requests[rid]
            if r.num_computed >= r.req.num_prompt_tokens:
                decode += 1
            else:
                prefill += n
            r.num_computed += n
            r.is_prefill_chunk = r.num_computed < r.req.num_tokens + r.placeholders
            if not r.is_prefill_chunk:
                sampling.append(r)
                if self._async:
                    r.placeholders += 1
        self.finished_since_schedule = 0
        return StepPlan(num_sched, sampling, preempted, prefill, decode)

    def update(self, plan: StepPlan, done_ms: float = 0.0) -> list[SchedRequest]:
        """Apply a step's sampled tokens; the requests that finished, in order."""
        finished: list[SchedRequest] = []
        stopped_running: list[SchedRequest] = []
        stopped_waiting: list[SchedRequest] = []
        model_len = self._model_len
        async_ = self._async
        slots = self.slots
        for r in plan.sampling:
            if r.status == FINISHED:
                continue
            before = r.status
            req = r.req
            req.append_output_token_ids(r.outputs[req.num_tokens - req.num_prompt_tokens])
            if r.first_token_ms < 0:
                r.first_token_ms = done_ms
            stopped = (
                req.num_tokens >= model_len
                or req.num_tokens - req.num_prompt_tokens >= r.max_tokens
            )
            if async_:
                r.placeholders -= 1
                if before == RUNNING:
                    slots.cache_blocks(r, r.num_computed - r.placeholders)
            if stopped:
                r.status = FINISHED
                r.finish_ms = done_ms
                slots.free(r)
                del self.requests[r.rid]
                self.finished_since_schedule += 1
                finished.append(r)
                (stopped_running if before == RUNNING else stopped_waiting).append(r)
        if stopped_running:
            gone = set(map(id, stopped_running))
            self.running = [r for r in self.running if id(r) not in gone]
        if stopped_waiting:
            self.waiting.remove(stopped_waiting)
        return finished
