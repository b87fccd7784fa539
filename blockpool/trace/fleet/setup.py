"""What both fleet replays (``sequence.py``, ``timed.py``) are built from:
the trace, the replicas and their pools, the hash and the router."""

from __future__ import annotations

from dataclasses import dataclass

from blockpool.core.free_order import FreeOrder
from blockpool.core.hashing import HashFn
from blockpool.trace.fleet.routers import Router
from blockpool.trace.workload.reader import Trace


@dataclass(frozen=True)
class FleetSetup:
    """``replicas`` pools of ``blocks`` each (None: never evicts) of
    ``block_size`` tokens and ``free_order``, behind ``router``; requests
    hashed with ``hash_fn``; ``capacity_tokens`` labels each replica's result."""

    trace: Trace
    block_size: int
    replicas: int
    blocks: int | None
    hash_fn: HashFn
    router: Router
    free_order: FreeOrder
    capacity_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
