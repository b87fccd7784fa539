"""Timed replays through vLLM's scheduler model (``scheduler.py``, ``engine.py``).

Arrivals at ``timestamp / speed`` ms; before each engine step the requests
that have arrived are added.  A prompt of ``max_model_len`` tokens or more is
rejected (``rejected_too_long``; vLLM's input processor refuses it) and one
whose longest run (``prompt + outputs - 1`` tokens, outputs capped by
``max_model_len``) needs more blocks than the pool holds besides the null
block is refused (``refused``; vLLM would never finish it).

Per capacity it reports both hit rates: ``hit_rate`` (also
``request_hit_rate``) -- each admitted request's cached prefix at its first
schedule over the prompt tokens, what clients see -- and
``prefix_cache_hit_rate``, vLLM's ``vllm:prefix_cache_hits /
vllm:prefix_cache_queries``: every lookup, a blocked head request's retries
included, preempted requests' lookups apart.

A layout of several KV-cache groups, or one with a sliding window
(``groups``), runs on ``GroupSlots`` (vLLM's per-group block tables over
the one pool; ``kv_cache_groups`` in the result names them); one
full-attention group on ``KVSlots``.  With windows, a request is refused
when ``peak_blocks`` (an upper bound on what it holds at once) exceeds
the pool.  Times (simulated ms):
``ttft_ms`` (arrival to the end of the step that sampled the first token),
``queue_ms`` (arrival to the first schedule) and ``e2e_ms`` percentiles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from blockpool.core.attention import GroupSpec
from blockpool.core.free_order import APPEND_ALL
from blockpool.core.hashing import HashFn
from blockpool.core.manager import _request_block_hasher
from blockpool.core.pool import BlockPool
from blockpool.trace.replay.results import CapacityResult, capacity_blocks
from blockpool.trace.replay.sequence import make_pool, unbounded_blocks
from blockpool.trace.sched.engine_core import SimulatedEngineCore, StepModel
from blockpool.trace.sched.group_slots import GroupSlots, needs_groups, peak_blocks
from blockpool.trace.sched.sched_request import SchedRequest
from blockpool.trace.sched.scheduler import Scheduler, SchedulerConfig
from blockpool.trace.sched.slots import KVSlots, SlotBackend
from blockpool.trace.workload.keys import make_request
from blockpool.trace.workload.reader import Trace

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request's story in a scheduled replay (``records=True``)."""

    index: int
    cached_tokens: int  # the cached prefix at its first schedule (-1: never scheduled)
    preemptions: int
    finish_order: int  # position among the finished (-1: rejected or refused)
    queue_ms: float
    ttft_ms: float
    e2e_ms: float


@dataclass
class ScheduledRun:
    result: CapacityResult
    records: list[RequestRecord] = field(default_factory=list)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p90/p99 and the mean (None when empty)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    v = sorted(values)
    n = len(v)
    out: dict[str, float | None] = {}
    for p in PERCENTILES:
        k = max(0, -(-p * n // 100) - 1)
        out[f"p{p}"] = v[k]
    out["mean"] = sum(v) / n
    return out


def _pool(num_blocks: int, block_size: int, free_order: str) -> BlockPool:
    if free_order == APPEND_ALL:
        return BlockPool(num_blocks, True, block_size, False)
    make_pool(2, block_size, free_order)  # refuses a free order this pool lacks
    return BlockPool(num_blocks, True, block_size, False, free_order=free_order)


def run_scheduled(
    trace: Trace,
    pool: BlockPool,
    block_size: int,
    hash_fn: HashFn,
    result: CapacityResult,
    config: SchedulerConfig,
    step_model: StepModel | None = None,
    speed: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
    records: bool = False,
    slots: SlotBackend | None = None,
    groups: Sequence[GroupSpec] = (),
) -> ScheduledRun:
    """Replay ``trace`` through the scheduler model on ``pool`` (through
    ``slots`` on it when given; else ``GroupSlots`` for ``groups`` that need
    it, ``KVSlots`` otherwise; both also count the miss reasons and
    evictions)."""
    if not speed > 0:
        raise ValueError("speed must be > 0")
    model = step_model or StepModel()
    grouped = needs_groups(groups)
    if slots is None:
        if grouped:
            slots = GroupSlots(pool, groups, config.model_len, result.misses)
        else:
            slots = KVSlots(pool, block_size, config.model_len, result.misses)
    max_chunk = min(config.budget, config.long_prefill_token_threshold or config.budget)
    sched = Scheduler(slots, config)
    engine = SimulatedEngineCore(sched, model)
    hasher = _request_block_hasher(pool.hash_block_size, hash_fn)
    usable = pool.num_gpu_blocks - 1
    model_len = config.model_len
    reqs = trace.requests
    total = len(reqs)
    i = 0
    clock = 0.0
    done = 0
    live: list[SchedRequest] = []
    finished: list[SchedRequest] = []
    too_long = too_long_tokens = 0
    never: list[RequestRecord] = []  # rejected or refused (records=True)
    while i < total or engine.busy():
        if not engine.busy():
            t = reqs[i].timestamp_ms / speed
            if t > clock:
                clock = t
        while i < total and reqs[i].timestamp_ms / speed <= clock:
            tr = reqs[i]
            i += 1
            result.prompt_tokens += tr.input_length
            if tr.input_length >= model_len:
                too_long += 1
                too_long_tokens += tr.input_length
                if records:
                    never.append(RequestRecord(tr.index, -1, 0, -1, -1.0, -1.0, -1.0))
                done += 1
                continue
            out = max(tr.output_length, 1)
            if tr.input_length + out > model_len:
                out = model_len - tr.input_length
            if (
                peak_blocks(groups, tr.input_length + out - 1, max_chunk)
                if grouped
                else -(-(tr.input_length + out - 1) // block_size)
            ) > usable:
                result.refused += 1
                result.refused_tokens += tr.input_length
                if records:
                    never.append(RequestRecord(tr.index, -1, 0, -1, -1.0, -1.0, -1.0))
                done += 1
                continue
            req = make_request(trace, tr, str(tr.index), hasher)
            outs = trace.output_token_ids(tr) if tr.output_length else [0]
            r = SchedRequest(req, outs, out, tr.timestamp_ms / speed, tr.priority, tr.index)
            sched.add(r)
            if records:
                live.append(r)
        dt, fin = engine.step(clock)
        clock += dt
        if fin:
            done += len(fin)
            finished.extend(fin)
        if progress is not None and engine.steps & 255 == 0:
            progress(done, total)
    stats = slots.stats
    ttft, queue, e2e = [], [], []
    hit = 0
    admitted = 0
    for r in finished:
        hit += r.num_cached_tokens
        admitted += 1
        ttft.append(r.first_token_ms - r.arrival_ms)
        queue.append(r.first_sched_ms - r.arrival_ms)
        e2e.append(r.finish_ms - r.arrival_ms)
    result.hit_tokens = hit
    result.admitted = admitted
    result.preemptions = sched.preemptions
    if isinstance(slots, (KVSlots, GroupSlots)):
        cached_now = sum(1 for b in pool.blocks if b.block_hash is not None)
        result.evictions = slots.stored - cached_now
    x = result.extra
    x["scheduler"] = {**asdict(config), "step_model": model.to_json()}
    if grouped:
        x["kv_cache_groups"] = [asdict(g) for g in groups]
    x["request_hit_rate"] = result.hit_rate
    x.update(stats.to_json())
    x["rejected_too_long"] = too_long
    x["rejected_too_long_tokens"] = too_long_tokens
    x["ttft_ms"] = percentiles(ttft)
    x["queue_ms"] = percentiles(queue)
    x["e2e_ms"] = percentiles(e2e)
    x["steps"] = engine.steps
    x["simulated_seconds"] = clock / 1000.0
    if progress is not None:
        progress(total, total)
    run = ScheduledRun(result, never)
    if records:
        order = {id(r): k for k, r in enumerate(finished)}
        for r in live:
            run.records.append(
                RequestRecord(
                    r.index,
                    r.num_cached_tokens,
                    r.num_preemptions,
                    order.get(id(r), -1),
                    r.first_sched_ms - r.arrival_ms,
                    r.first_token_ms - r.arrival_ms,
                    r.finish_ms - r.arrival_ms,
                )
            )
        run.records.sort(key=lambda rec: rec.index)
    return run


def replay_scheduled(
    trace: Trace,
    block_size: int,
    capacities_tokens: Sequence[int | None],
    hash_fn: HashFn,
    free_order: str,
    config: SchedulerConfig,
    step_model: StepModel | None = None,
    speed: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
    groups: Sequence[GroupSpec] = (),
) -> list[CapacityResult]:
    """The scheduler model at each capacity (one replay each; ``groups``:
    the KV-cache groups, as ``run_scheduled`` takes them)."""
    out = []
    for cap in capacities_tokens:
        blocks = capacity_blocks(cap, block_size)
        if blocks is not None and blocks < 2:
            raise ValueError(f"{cap} tokens hold no usable block of {block_size} tokens")
        n = (
            blocks
            if blocks is not None
            else (
                unbounded_blocks(trace, block_size)
                + sum(-(-r.output_length // block_size) + 1 for r in trace.requests)
            )
            * max(1, len(groups))
        )
        result = CapacityResult(cap, blocks)
        pool = _pool(n, block_size, free_order)
        run_scheduled(
            trace, pool, block_size, hash_fn, result, config, step_model, speed, progress,
            groups=groups,
        )  # fmt: skip
        out.append(result)
    return out
