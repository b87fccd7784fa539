"""A capacity plan of a trace: a typed request in, a report and a plan out.

What ``blockpool trace`` answers without ``--replicas``: the replay at each
pool size (in memory through a model's KV layout, or in tokens and blocks),
a dense sweep between them, the offline optimum and other policies beside
LRU, and the smallest pool reaching a hit rate.  The command line only turns
its flags into a :class:`~blockpool.trace.plan.plan_request.PlanRequest`
(plan_request.py: the request and its layout) and renders the
:class:`PlanResult`; the service could make the same request.  The sizes
replayed are pool_sizes.py's; this module holds the plan and its steps.

The steps, in the order their errors are raised (a flag's error before the
trace is read, the trace's before the replay's):

1. :func:`prepare`: the request's KV layout, groups, policies and sizes;
2. :meth:`PlanSetup.plan_for` the trace: the sweep's sizes, what the groups
   refuse;
3. :func:`run_plan`: the replay, then the policies and the target search.

:func:`plan_trace` does all three.

A layout of sliding-window KV-cache groups (a model config or layout naming
them) is replayed exactly per capacity; it has no optimum (``optimal:
null`` with ``optimal_reason`` in the JSON), no shadow policies, and no miss
reasons (hit and missed tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from blockpool.core.attention import GroupSpec
from blockpool.core.free_order import FreeOrder
from blockpool.core.hashing import get_hash_fn_by_name
from blockpool.trace.plan.plan_request import PlanRequest, parse_policies
from blockpool.trace.plan.planner import (
    NO_OPTIMUM,
    NO_SHADOWS,
    SHADOW_POLICIES,
    TargetAnswer,
    group_unbounded_hit_tokens,
    shadow_curve,
    smallest_capacity,
    smallest_group_capacity,
)
from blockpool.trace.plan.pool_sizes import (
    capacities_of,
    groups_of,
    sweep_capacities,
    usable_tokens_of,
)
from blockpool.trace.plan.report import DEFAULT_FREE_ORDER, TraceReport, replay_trace
from blockpool.trace.replay.optimal import OptimalCurve
from blockpool.trace.replay.results import CapacityResult, parse_capacities
from blockpool.trace.replay.sequence_groups import REASONS_NOTE, describe_groups
from blockpool.trace.sched.group_slots import needs_groups
from blockpool.trace.sched.timed import TimedConfig
from blockpool.trace.sizing.capacity import Capacity, KVLayout, block_bytes_of
from blockpool.trace.workload.keys import BlockKeys
from blockpool.trace.workload.reader import Trace

ProgressFn = Callable[[int, int], None]
# a phase's progress callback, given its label and unit (None: silent)
Bars = Callable[[str, str], ProgressFn | None]


def no_bars(_label: str, _unit: str) -> ProgressFn | None:
    return None


# ------------------------------------------------------------------ sizes


# ---------------------------------------------------------------- the plan


@dataclass
class Plan:
    """What the planner adds to a report."""

    caps: list[Capacity]
    layout: KVLayout | None
    policies: list[str] = field(default_factory=list)
    unbounded_hit_tokens: int | None = None
    target: TargetAnswer | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    groups: list[GroupSpec] | None = None  # sliding-window KV-cache groups (None: plain)
    mode: str = "sequence"  # timed mode classifies its misses over groups too
    optimal: OptimalCurve | None = None  # built once, for the table and the target

    def info(self, block_size: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policies": ["lru", *self.policies],
            "unbounded_hit_tokens": self.unbounded_hit_tokens,
            "planner_seconds": self.seconds,
        }
        if self.groups is not None:
            out["kv_cache_groups"] = describe_groups(self.groups)
            out["kv_cache_tokens_formula"] = "num_gpu_blocks // groups * block size"
            out["optimal"] = None
            out["optimal_reason"] = NO_OPTIMUM
            if self.mode == "sequence":
                out["miss_reasons_note"] = REASONS_NOTE
        if self.layout is not None:
            out["kv_layout"] = {
                **self.layout.to_json(),
                "block_bytes": block_bytes_of(self.layout, block_size),
            }
        if self.target is not None:
            out["target"] = target_json(self.target, block_size, self.layout)
        return out


def target_json(t: TargetAnswer, bs: int, layout: KVLayout | None) -> dict[str, Any]:
    def size(b: int | None) -> dict[str, Any] | None:
        if b is None:
            return None
        bb = block_bytes_of(layout, bs)
        used = None if bb is None else b * bb
        return {"blocks": b, "usable_tokens": usable_tokens_of(b, bs, layout), "bytes": used}

    out: dict[str, Any] = {
        "hit_rate": t.target,
        "lru": size(t.lru_blocks),
        "optimal": size(t.optimal_blocks),
        "unbounded_hit_rate": t.unbounded_hit_rate,
    }
    if t.optimal_reason is not None:
        out["optimal_reason"] = t.optimal_reason
    if t.search is not None:
        out["search"] = t.search
    if t.floor_blocks is not None:  # no smaller pool is an answer: it refuses requests
        out["smallest_pool_refusing_nothing"] = size(t.floor_blocks)
    return out


def check_groups(plan: Plan) -> None:
    """Refuse what the planner cannot give over sliding-window groups."""
    if plan.groups is None:
        return
    shadows = [p for p in plan.policies if p in SHADOW_POLICIES]
    if shadows:
        raise ValueError(NO_SHADOWS.format(policies=", ".join(shadows)))
    plan.policies = []  # no optimum: NO_OPTIMUM says why


def annotate(
    results: list[CapacityResult], caps: list[Capacity], groups: list[GroupSpec] | None = None
) -> None:
    """Each result's label, usable tokens and bytes (what the pool holds);
    over KV-cache groups also vLLM's token capacity and the absent optimum."""
    for r, c in zip(results, caps, strict=True):
        r.extra["capacity"] = c.label
        r.extra["usable_blocks"] = c.usable_blocks
        r.extra["usable_tokens"] = c.usable_tokens
        r.extra["bytes"] = c.bytes
        r.extra["kv_cache_tokens"] = c.kv_cache_tokens
        if groups is not None:
            r.extra["optimal_hit_tokens"] = None


def run_policies(
    plan: Plan,
    trace: Trace,
    block_size: int,
    results: list[CapacityResult],
    bars: Bars = no_bars,
) -> None:
    """The optimum (and the shadows' policies) at every capacity, into ``extra``;
    over KV-cache groups only the unbounded ceiling (which bounds them too)."""
    t0 = time.perf_counter()
    keys = BlockKeys(trace, block_size)
    opt = plan.optimal = OptimalCurve(trace, block_size, keys)
    plan.unbounded_hit_tokens = group_unbounded_hit_tokens(block_size, opt)
    usable = [c.usable_blocks for c in plan.caps]
    if "optimal" in plan.policies:
        hits = opt.hit_tokens(usable, bars("optimal", "capacities"))
        for r, h in zip(results, hits, strict=True):
            r.extra["optimal_hit_tokens"] = h
            r.extra["optimal_hit_rate"] = h / r.prompt_tokens if r.prompt_tokens else 0.0
        plan.seconds["optimal"] = time.perf_counter() - t0
    for pol in plan.policies:
        if pol not in SHADOW_POLICIES:
            continue
        t1 = time.perf_counter()
        got = shadow_curve(trace, block_size, keys, pol, usable, bars(pol, "capacities"))
        for r, g in zip(results, got, strict=True):
            h = plan.unbounded_hit_tokens if g is None else g[0]
            r.extra[f"{pol}_hit_tokens"] = h
            r.extra[f"{pol}_hit_rate"] = h / r.prompt_tokens if r.prompt_tokens else 0.0
            r.extra[f"{pol}_evictions"] = 0 if g is None else g[1]
        plan.seconds[pol] = time.perf_counter() - t1
    for r in results:
        r.extra["unbounded_hit_rate"] = (
            plan.unbounded_hit_tokens / r.prompt_tokens if r.prompt_tokens else 0.0
        )


def find_target(
    plan: Plan,
    trace: Trace,
    block_size: int,
    target: float,
    bars: Bars = no_bars,
    hash_name: str = "sha256",
    free_order: FreeOrder = DEFAULT_FREE_ORDER,
) -> None:
    t0 = time.perf_counter()
    bar = bars("target", "passes")
    if plan.groups is not None:
        plan.target = smallest_group_capacity(
            trace, plan.groups, target, get_hash_fn_by_name(hash_name), progress=bar,
            free_order=free_order,
        )  # fmt: skip
    else:
        plan.target = smallest_capacity(
            trace, block_size, target, plan.optimal, bar, free_order=free_order
        )
    plan.seconds["target"] = time.perf_counter() - t0


# ---------------------------------------------------------------- the steps


@dataclass(frozen=True)
class PlanSetup:
    """A request checked: its layout, groups, policies and sizes."""

    request: PlanRequest
    layout: KVLayout | None
    groups: list[GroupSpec] | None
    policies: list[str]
    caps: list[Capacity]

    def plan_for(self, trace: Trace) -> Plan:
        """The plan on ``trace``: the sweep's sizes added, what the groups
        refuse refused."""
        req = self.request
        caps = self.caps
        if req.sweep:
            opt = OptimalCurve(trace, req.block_size)
            caps = sweep_capacities(req.block_size, req.sweep_points, caps, opt, trace, self.groups)
        plan = Plan(caps, self.layout, list(self.policies), groups=self.groups, mode=req.mode)
        check_groups(plan)
        return plan


@dataclass
class PlanResult:
    """The replay at every size (``report``: its results annotated with the
    planner's columns) and what the planner found (``plan``)."""

    report: TraceReport
    plan: Plan

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(), **self.plan.info(self.report.block_size)}


def prepare(request: PlanRequest) -> PlanSetup:
    """The request checked, before any trace is read (ValueError naming the flag)."""
    layout = request.layout.layout()
    groups = groups_of(layout, request.block_size)
    policies = parse_policies(request.policies, request.mode)
    tokens = parse_capacities(request.capacity_tokens) if request.capacity_tokens else []
    blocks = parse_capacities(request.capacity_blocks) if request.capacity_blocks else []
    caps = capacities_of(request.capacity, request.block_size, layout, tokens, blocks)
    return PlanSetup(request, layout, groups, policies, caps)


def timed_with_groups(
    timed: TimedConfig | None, layout: KVLayout | None, block_size: int
) -> TimedConfig:
    """Timed mode's config with the layout's KV-cache groups where it needs them."""
    specs = () if layout is None else tuple(layout.group_specs(block_size))
    groups = specs if needs_groups(specs) else ()
    return replace(timed or TimedConfig(), groups=groups)


def run_plan(
    setup: PlanSetup, plan: Plan, trace: Trace, timed: TimedConfig, bars: Bars = no_bars
) -> PlanResult:
    """The replay at the plan's sizes, then the policies and the target."""
    req = setup.request
    label = "one pass" if req.mode == "sequence" else req.mode
    report = replay_trace(
        trace,
        mode=req.mode,
        block_size=req.block_size,
        capacities_tokens=[c.capacity_tokens for c in plan.caps],
        hash_name=req.hash_name,
        free_order=req.free_order,
        timed=timed,
        one_pass=req.one_pass,
        progress=bars(f"{label} ({len(plan.caps)} capacities)", "req"),
        groups=setup.groups,
    )
    annotate(report.results, plan.caps, setup.groups)
    if req.mode == "sequence":
        run_policies(plan, trace, req.block_size, report.results, bars)
    if req.target_hit_rate is not None:
        if req.mode != "sequence":
            raise ValueError("--target-hit-rate searches sequence-mode replays only")
        find_target(
            plan, trace, req.block_size, req.target_hit_rate, bars, req.hash_name, req.free_order
        )
    return PlanResult(report, plan)


def plan_trace(request: PlanRequest, trace: Trace, bars: Bars = no_bars) -> PlanResult:
    """The whole plan of ``trace`` in one call."""
    setup = prepare(request)
    plan = setup.plan_for(trace)
    timed = timed_with_groups(request.timed, setup.layout, request.block_size)
    return run_plan(setup, plan, trace, timed, bars)
