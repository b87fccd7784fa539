"""A request as vLLM 0.16's scheduler holds it (blockpool/trace/sched/scheduler.py):
its tokens (``SchedTokens``: a trace's ``Request``, or a live replay's counts),
progress, status and times (ms), and the two waiting queues a scheduling
policy orders requests in (``fcfs``: arrival; ``priority``: a heap by
``(priority, arrival, id)``)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

from blockpool.core.hashing import BlockHash

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


class SchedTokens(Protocol):
    """What the scheduler reads of a request's tokens (a ``Request``, or a
    live replay's counts whose tokens are built a chunk at a time)."""

    @property
    def request_id(self) -> str: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def block_hashes(self) -> list[BlockHash]: ...

    def append_output_token_ids(self, token_ids: int) -> None: ...


class SchedRequest:
    """A request in the scheduler: its tokens, progress and times (ms)."""

    __slots__ = (
        "arrival_ms",
        "finish_ms",
        "first_sched_ms",
        "first_token_ms",
        "index",
        "is_prefill_chunk",
        "max_tokens",
        "num_cached_tokens",
        "num_computed",
        "num_preemptions",
        "outputs",
        "placeholders",
        "priority",
        "req",
        "rid",
        "status",
    )

    def __init__(
        self,
        req: SchedTokens,
        outputs: Sequence[int],
        max_tokens: int,
        arrival_ms: float,
        priority: int = 0,
        index: int = 0,
    ) -> None:
        self.req = req
        self.rid = req.request_id
        self.outputs = outputs
        self.max_tokens = max_tokens
        self.arrival_ms = arrival_ms
        self.priority = priority
        self.index = index
        self.num_computed = 0
        self.placeholders = 0
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.status = WAITING
        self.is_prefill_chunk = False
        self.first_sched_ms = -1.0
        self.first_token_ms = -1.0
        self.finish_ms = -1.0

    @property
    def num_tokens(self) -> int:
        return self.req.num_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return self.req.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.req.num_tokens - self.req.num_prompt_tokens

    @property
    def block_hashes(self) -> list[BlockHash]:
        return self.req.block_hashes

    @property
    def hashable(self) -> object:
        return self.req

    def __lt__(self, other: SchedRequest) -> bool:  # the priority queue's order
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_ms != other.arrival_ms:
            return self.arrival_ms < other.arrival_ms
        return self.rid < other.rid


class FcfsQueue:
    """The waiting queue in arrival order (``fcfs``)."""

    def __init__(self) -> None:
        self.q: deque[SchedRequest] = deque()

    def __len__(self) -> int:
        return len(self.q)

    def add(self, r: SchedRequest) -> None:
        self.q.append(r)

    def prepend(self, r: SchedRequest) -> None:
        self.q.appendleft(r)

    def peek(self) -> SchedRequest:
        return self.q[0]

    def pop(self) -> SchedRequest:
        return self.q.popleft()

    def remove(self, reqs: Iterable[SchedRequest]) -> None:
        gone = set(map(id, reqs))
        self.q = deque(r for r in self.q if id(r) not in gone)


class PriorityQueue:
    """The waiting queue by ``(priority, arrival, id)`` (``priority``)."""

    def __init__(self) -> None:
        self.h: list[SchedRequest] = []

    def __len__(self) -> int:
        return len(self.h)

    def add(self, r: SchedRequest) -> None:
        heapq.heappush(self.h, r)

    prepend = add

    def peek(self) -> SchedRequest:
        return self.h[0]

    def pop(self) -> SchedRequest:
        return heapq.heappop(self.h)

    def remove(self, reqs: Iterable[SchedRequest]) -> None:
        gone = set(map(id, reqs))
        self.h = [r for r in self.h if id(r) not in gone]
        heapq.heapify(self.h)
