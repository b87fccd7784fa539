"""Sequence mode over a fleet: each request routed, then replayed on its
replica's own exact pool (a :class:`~blockpool.trace.replay.sequence.SequenceDriver`
over a real ``BlockPool``, the single-pool replay's code).

The router looks at the replicas' real pools just before the request runs
(``cached_blocks`` walks ``get_cached_block`` as the replay's lookup will).
``assignment[i]`` is the replica of request ``i``, ``hits[i]`` its hit
blocks there (-1: refused), for checks and for a per-request view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from blockpool.core.admission import cdiv, hit_limit
from blockpool.core.block_hasher import get_request_block_hasher
from blockpool.core.hashing import BlockHash
from blockpool.trace.fleet.routers import cached_prefix
from blockpool.trace.fleet.setup import FleetSetup
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.replay.sequence import SequenceDriver, make_pool, unbounded_blocks
from blockpool.trace.replay.sequence_groups import GroupRequest
from blockpool.trace.workload.keys import make_request


class SequenceReplica:
    """One replica: its pool, its driver, and the prompt blocks routed to it."""

    def __init__(self, driver: SequenceDriver, floor: list[int]) -> None:
        self.driver = driver
        self.floor = floor  # shared: the fewest prompt blocks routed to any replica
        self.routed_blocks = 0
        self.routed_requests = 0
        self.routed_tokens = 0

    def cached_blocks(self, hashes: Sequence[BlockHash], max_hit: int) -> int:
        return cached_prefix(self.driver.pool, hashes, max_hit)

    @property
    def load_blocks(self) -> int:
        return self.routed_blocks - self.floor[0]

    @property
    def in_flight(self) -> int:
        return self.load_blocks


class FleetSequence:
    """The fleet of ``setup``, each replica an exact pool replayed in sequence."""

    def __init__(self, setup: FleetSetup) -> None:
        self.setup = setup
        trace, block_size, blocks = setup.trace, setup.block_size, setup.blocks
        n = blocks if blocks is not None else unbounded_blocks(trace, block_size)
        self.replicas: list[SequenceReplica] = []
        self.floor = [0]
        for _ in range(setup.replicas):
            pool = make_pool(n, block_size, setup.free_order)
            res = CapacityResult(setup.capacity_tokens, blocks)
            self.replicas.append(SequenceReplica(SequenceDriver(pool, block_size, res), self.floor))
        self.assignment: list[int] = []
        self.hits: list[int] = []

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[CapacityResult]:
        setup = self.setup
        bs = setup.block_size
        trace = setup.trace
        hasher = get_request_block_hasher(bs, setup.hash_fn)
        replicas = self.replicas
        route = setup.router.route
        total = len(trace.requests)
        for i, req in enumerate(trace.requests):
            r = make_request(trace, req, str(i), hasher)
            hashes = r.block_hashes
            n = req.input_length
            blocks = cdiv(n, bs)
            j = route(req, hashes, hit_limit(n, bs, n // bs), blocks, replicas)
            rep = replicas[j]
            low = rep.routed_blocks == self.floor[0]
            rep.routed_blocks += blocks
            if low:
                self.floor[0] = min(r.routed_blocks for r in replicas)
            rep.routed_requests += 1
            rep.routed_tokens += n
            view = GroupRequest(r.request_id, r.all_token_ids, hashes, r.lora_request)
            self.hits.append(rep.driver.step(n, view, hashes))
            self.assignment.append(j)
            if progress is not None and (i & 15 == 15 or i + 1 == total):
                progress(i + 1, total)
        return [rep.driver.result for rep in replicas]
