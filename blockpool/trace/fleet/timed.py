"""Timed mode over a fleet: each replica is vLLM's scheduler and engine loop
(``scheduler.py``, ``engine.py``) on its own exact pool, all on one
simulated clock.

At each arrival (``timestamp / speed`` ms) every replica is first run up to
that time -- the steps that start before it -- so that the router sees each
replica as it is when the request arrives (its real cache, its running and
waiting requests); the request is then added to the chosen replica, as
:func:`~blockpool.trace.sched.scheduled.run_scheduled` adds an arrival before the
next step.  One replica is exactly ``run_scheduled``'s replay (tested).
Refusals are those of ``run_scheduled``: a prompt of ``max_model_len``
tokens or more is rejected, one whose longest run needs more blocks than a
replica holds is refused.  One full-attention KV-cache group only.

Per replica: the hit tokens at first schedule, evictions, preemptions; over
the fleet: ``ttft_ms`` and ``queue_ms`` percentiles of every finished request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from blockpool.core.admission import cdiv, hit_limit
from blockpool.core.free_order import APPEND_ALL, FreeOrder
from blockpool.core.hashing import BlockHash
from blockpool.core.manager import _request_block_hasher
from blockpool.core.pool import BlockPool
from blockpool.trace.fleet.routers import cached_prefix
from blockpool.trace.fleet.setup import FleetSetup
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.replay.sequence import make_pool, unbounded_blocks
from blockpool.trace.sched.engine_core import SimulatedEngineCore, StepModel
from blockpool.trace.sched.sched_request import SchedRequest
from blockpool.trace.sched.scheduled import percentiles
from blockpool.trace.sched.scheduler import Scheduler, SchedulerConfig
from blockpool.trace.sched.slots import KVSlots
from blockpool.trace.workload.keys import make_request


def _pool(num_blocks: int, block_size: int, free_order: FreeOrder) -> BlockPool:
    if free_order == APPEND_ALL:
        return BlockPool(num_blocks, True, block_size, False)
    make_pool(2, block_size, free_order)  # refuses a free order this pool lacks
    return BlockPool(num_blocks, True, block_size, False, free_order=free_order)


class TimedReplica:
    """One engine on its own pool, with its own clock (ms)."""

    def __init__(
        self,
        blocks: int,
        block_size: int,
        free_order: FreeOrder,
        config: SchedulerConfig,
        model: StepModel,
        result: CapacityResult,
    ) -> None:
        self.pool = _pool(blocks, block_size, free_order)
        self.block_size = block_size
        self.result = result
        self.slots = KVSlots(self.pool, block_size, config.model_len, result.misses)
        self.sched = Scheduler(self.slots, config)
        self.engine = SimulatedEngineCore(self.sched, model)
        self.usable = blocks - 1
        self.clock = 0.0
        self.finished: list[SchedRequest] = []
        self.pending: list[SchedRequest] = []  # routed here, not scheduled yet
        self.routed_requests = 0
        self.routed_tokens = 0

    def advance(self, t: float) -> None:
        """Run the steps that start before ``t``; an idle engine waits until ``t``."""
        engine = self.engine
        while engine.busy() and self.clock < t:
            dt, fin = engine.step(self.clock)
            self.clock += dt
            self.finished.extend(fin)
        if not engine.busy() and self.clock < t:
            self.clock = t

    def drain(self) -> None:
        engine = self.engine
        while engine.busy():
            dt, fin = engine.step(self.clock)
            self.clock += dt
            self.finished.extend(fin)

    def cached_blocks(self, hashes: Sequence[BlockHash], max_hit: int) -> int:
        return cached_prefix(self.pool, hashes, max_hit)

    @property
    def load_blocks(self) -> int:
        """Blocks in use plus the prompt blocks of the requests still waiting."""
        self.pending = [r for r in self.pending if r.first_sched_ms < 0 and r.finish_ms < 0]
        bs = self.block_size
        waiting = sum(cdiv(r.num_prompt_tokens, bs) for r in self.pending)
        return self.usable - self.pool.get_num_free_blocks() + waiting

    @property
    def in_flight(self) -> int:
        return len(self.sched.waiting) + len(self.sched.running)


class FleetTimed:
    """The fleet of ``setup``, each replica an engine on the simulated clock."""

    def __init__(
        self,
        setup: FleetSetup,
        config: SchedulerConfig,
        step_model: StepModel | None = None,
        speed: float = 1.0,
    ) -> None:
        if not speed > 0:
            raise ValueError("speed must be > 0")
        self.setup = setup
        self.config = config
        self.model = step_model or StepModel()
        self.speed = speed
        trace, block_size, blocks = setup.trace, setup.block_size, setup.blocks
        n = blocks
        if n is None:  # as replay_scheduled sizes an unbounded pool
            n = unbounded_blocks(trace, block_size) + sum(
                -(-r.output_length // block_size) + 1 for r in trace.requests
            )
        self.replicas = [
            TimedReplica(
                n,
                block_size,
                setup.free_order,
                config,
                self.model,
                CapacityResult(setup.capacity_tokens, blocks),
            )
            for _ in range(setup.replicas)
        ]
        self.assignment: list[int] = []  # -1: rejected as too long

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[CapacityResult]:
        setup = self.setup
        trace = setup.trace
        bs = setup.block_size
        hasher = _request_block_hasher(bs, setup.hash_fn)
        model_len = self.config.model_len
        speed = self.speed
        replicas = self.replicas
        route = setup.router.route
        total = len(trace.requests)
        too_long = [0] * len(replicas)
        too_long_tokens = [0] * len(replicas)
        for i, tr in enumerate(trace.requests):
            t = tr.timestamp_ms / speed
            for rep in replicas:
                rep.advance(t)
            req = make_request(trace, tr, str(tr.index), hasher)
            n = tr.input_length
            hashes = req.block_hashes
            j = route(tr, hashes, hit_limit(n, bs, len(hashes)), cdiv(n, bs), replicas)
            self.assignment.append(j)
            rep = replicas[j]
            rep.routed_requests += 1
            rep.routed_tokens += n
            res = rep.result
            res.prompt_tokens += n
            if n >= model_len:
                too_long[j] += 1
                too_long_tokens[j] += n
                continue
            out = max(tr.output_length, 1)
            if n + out > model_len:
                out = model_len - n
            if cdiv(n + out - 1, bs) > rep.usable:
                res.refused += 1
                res.refused_tokens += n
                continue
            outs = trace.output_token_ids(tr) if tr.output_length else [0]
            r = SchedRequest(req, outs, out, t, tr.priority, tr.index)
            rep.sched.add(r)
            rep.pending.append(r)
            if progress is not None and (i & 63 == 63):
                progress(i + 1, total)
        for rep in replicas:
            rep.drain()
        for k, rep in enumerate(replicas):
            self._finish(rep, too_long[k], too_long_tokens[k])
        if progress is not None:
            progress(total, total)
        return [rep.result for rep in replicas]

    def _finish(self, rep: TimedReplica, too_long: int, too_long_tokens: int) -> None:
        res = rep.result
        res.hit_tokens = sum(r.num_cached_tokens for r in rep.finished)
        res.admitted = len(rep.finished)
        res.preemptions = rep.sched.preemptions
        cached_now = sum(1 for b in rep.pool.blocks if b.block_hash is not None)
        res.evictions = rep.slots.stored - cached_now
        x = res.extra
        x["request_hit_rate"] = res.hit_rate
        x.update(rep.slots.stats.to_json())
        x["rejected_too_long"] = too_long
        x["rejected_too_long_tokens"] = too_long_tokens
        x["ttft_ms"] = percentiles(self.ttft(rep))
        x["queue_ms"] = percentiles(self.queue(rep))
        x["steps"] = rep.engine.steps
        x["simulated_seconds"] = rep.clock / 1000.0

    @staticmethod
    def ttft(rep: TimedReplica) -> list[float]:
        return [r.first_token_ms - r.arrival_ms for r in rep.finished]

    @staticmethod
    def queue(rep: TimedReplica) -> list[float]:
        return [r.first_sched_ms - r.arrival_ms for r in rep.finished]

    def fleet_times(self) -> tuple[dict[str, float | None], dict[str, float | None]]:
        """TTFT and queueing percentiles over every finished request of the fleet."""
        ttft: list[float] = []
        queue: list[float] = []
        for rep in self.replicas:
            ttft += self.ttft(rep)
            queue += self.queue(rep)
        return percentiles(ttft), percentiles(queue)
