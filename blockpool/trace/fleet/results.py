"""What one fleet configuration's replay found.

A configuration is ``replicas`` pools of ``blocks`` each (vLLM's
``num_gpu_blocks``, null block included; None: never evicts) behind one
router.  Per replica: a :class:`~blockpool.trace.replay.results.CapacityResult`
(the same counts a single-pool replay reports) and the requests routed to
it; over the fleet: the hit rate, the load balance (max / mean of requests
and of prompt tokens routed; 1.0 is even) and, in timed mode, TTFT and
queueing percentiles over every finished request.  A figure not known (no
memory size without a model layout, times in sequence mode) is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from blockpool.trace.replay.results import CapacityResult


@dataclass(frozen=True)
class FleetJob:
    """One configuration of a sweep: everything that varies between jobs."""

    replicas: int
    capacity: str  # the capacity as asked (a label)
    blocks: int | None  # per replica, null block included; None: unbounded
    router: str
    free_order: str
    block_bytes: int | None = None  # bytes of one block on one GPU (None: no layout)

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise ValueError(f"replicas must be an integer, got {self.replicas!r}")
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.blocks is not None and self.blocks < 2:
            raise ValueError(f"capacity {self.capacity!r} holds no usable block")

    @property
    def replica_bytes(self) -> int | None:
        if self.blocks is None or self.block_bytes is None:
            return None
        return self.blocks * self.block_bytes

    @property
    def total_bytes(self) -> int | None:
        b = self.replica_bytes
        return None if b is None else b * self.replicas

    @property
    def total_blocks(self) -> int | None:
        return None if self.blocks is None else self.blocks * self.replicas


def balance(values: list[int]) -> float | None:
    """max / mean (1.0: even); None when nothing was routed."""
    if not values or not sum(values):
        return None
    return max(values) / (sum(values) / len(values))


@dataclass
class FleetResult:
    job: FleetJob
    mode: str
    replicas: list[CapacityResult]
    routed_requests: list[int]
    routed_prompt_tokens: list[int]
    ttft_ms: dict[str, float | None] | None = None
    queue_ms: dict[str, float | None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    assignment: list[int] = field(default_factory=list)  # request i -> its replica

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.replicas)

    @property
    def hit_tokens(self) -> int:
        return sum(r.hit_tokens for r in self.replicas)

    @property
    def hit_rate(self) -> float | None:
        p = self.prompt_tokens
        return self.hit_tokens / p if p else None

    @property
    def ttft_p99(self) -> float | None:
        return None if self.ttft_ms is None else self.ttft_ms.get("p99")

    def to_json(self, assignment: bool = False) -> dict[str, Any]:
        """The figures (``assignment``: also each request's replica, in
        trace order: the routed requests an independent pool can be fed)."""
        j = self.job
        doc = {
            "replicas": j.replicas,
            "capacity": j.capacity,
            "blocks_per_replica": j.blocks,
            "bytes_per_replica": j.replica_bytes,
            "total_bytes": j.total_bytes,
            "total_blocks": j.total_blocks,
            "router": j.router,
            "free_order": j.free_order,
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "evictions": sum(r.evictions for r in self.replicas),
            "refused": sum(r.refused for r in self.replicas),
            "preemptions": sum(r.preemptions for r in self.replicas),
            "requests_balance": balance(self.routed_requests),
            "prompt_tokens_balance": balance(self.routed_prompt_tokens),
            "routed_requests": list(self.routed_requests),
            "routed_prompt_tokens": list(self.routed_prompt_tokens),
            "ttft_ms": self.ttft_ms,
            "queue_ms": self.queue_ms,
            **self.extra,
            "per_replica": [r.to_json() for r in self.replicas],
        }
        if assignment:
            doc["assignment"] = list(self.assignment)
        return doc
