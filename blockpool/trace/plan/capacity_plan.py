"""A capacity plan of a trace: a typed request in, a report and a plan out.

What ``blockpool trace`` answers without ``--replicas``: the replay at each
pool size (in memory through a model's KV layout, or in tokens and blocks),
a dense sweep between them, the offline optimum and other policies beside
LRU, and the smallest pool reaching a hit rate.  The command line only turns
its flags into a :class:`PlanRequest` and renders the :class:`PlanResult`;
the service could make the same request.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from blockpool.core.attention import GroupSpec
from blockpool.core.free_order import FreeOrder
from blockpool.core.hashing import get_hash_fn_by_name
from blockpool.trace.plan.planner import (
    NO_OPTIMUM,
    NO_SHADOWS,
    POLICIES,
    SHADOW_POLICIES,
    TargetAnswer,
    group_sweep_range,
    group_unbounded_hit_tokens,
    log_grid,
    shadow_curve,
    smallest_capacity,
    smallest_group_capacity,
    sweep_range,
)
from blockpool.trace.plan.report import DEFAULT_FREE_ORDER, TraceReport, replay_trace
from blockpool.trace.replay.optimal import OptimalCurve
from blockpool.trace.replay.results import CapacityResult, parse_capacities
from blockpool.trace.replay.sequence_groups import REASONS_NOTE, describe_groups, is_plain
from blockpool.trace.sched.group_slots import needs_groups
from blockpool.trace.sched.timed import TimedConfig
from blockpool.trace.sizing.capacity import (
    Capacity,
    KVCacheDtype,
    KVLayout,
    block_bytes_of,
    flat_bytes,
    groups_only,
    parse_capacity_list,
    parse_kv_cache_groups,
    read_model_config,
)
from blockpool.trace.workload.keys import BlockKeys
from blockpool.trace.workload.reader import Trace

ProgressFn = Callable[[int, int], None]
# a phase's progress callback, given its label and unit (None: silent)
Bars = Callable[[str, str], ProgressFn | None]


def no_bars(_label: str, _unit: str) -> ProgressFn | None:
    return None


# ------------------------------------------------------------------ request


def flag(text: str, metavar: str | None = None) -> dict[str, Any]:
    """A request field's flag: its help, the placeholder its help shows
    (type, default and choices come from the field)."""
    return {"help": text, "metavar": metavar}


@dataclass(frozen=True)
class LayoutRequest:
    """The pool's KV layout: a Hugging Face ``config.json`` (``model_config``)
    as vLLM reads it, or bytes a token (``bytes_per_token``) and/or the
    KV-cache groups by name (``kv_cache_groups``: ``full,sliding:4096x3``);
    nothing: sizes in tokens and blocks only.  Each field is a flag of
    ``blockpool trace`` (its metadata: :func:`flag`)."""

    model_config: str | None = field(
        default=None,
        metadata=flag(
            "a Hugging Face config.json: layers, KV heads, head size, MLA", "CONFIG_JSON"
        ),
    )
    bytes_per_token: int | None = field(
        default=None,
        metadata=flag("KV bytes per token on one GPU, all layers (instead of a model)", "N"),
    )
    kv_cache_dtype: KVCacheDtype = field(
        default="auto",
        metadata=flag("KV cache element type, as vLLM's flag (default auto: the model's)"),
    )
    tensor_parallel_size: int = field(
        default=1, metadata=flag("GPUs sharing the KV heads (default 1)", "TP")
    )
    disable_hybrid_kv_cache_manager: bool = field(
        default=False,
        metadata=flag(
            "as vLLM's flag: sliding-window layers beside full ones become full attention"
        ),
    )
    disable_sliding_window: bool = field(
        default=False,
        metadata=flag(
            "as vLLM's flag: every layer full attention (max_model_len capped at the window)"
        ),
    )
    kv_cache_groups: str | None = field(
        default=None,
        metadata=flag(
            "the KV-cache groups without a model config: comma list of full and "
            "sliding:WINDOW, each with an optional xCOUNT (full,sliding:4096x3); with "
            "--bytes-per-token N, N is a token's bytes in one group",
            "SPEC",
        ),
    )

    def layout(self) -> KVLayout | None:
        """The layout asked for (ValueError naming the flag when the request
        contradicts itself)."""
        if self.model_config and self.bytes_per_token is not None:
            raise ValueError("give --model-config or --bytes-per-token, not both")
        groups = self.kv_cache_groups
        if self.model_config:
            if groups is not None:
                raise ValueError("--kv-cache-groups is for runs without --model-config")
            return read_model_config(
                self.model_config,
                self.kv_cache_dtype,
                self.tensor_parallel_size,
                disable_sliding_window=self.disable_sliding_window,
                disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
            )
        for flag in ("disable_sliding_window", "disable_hybrid_kv_cache_manager"):
            if getattr(self, flag):
                raise ValueError(
                    f"--{flag.replace('_', '-')} acts on a --model-config's layers "
                    "(without one, name the groups: --kv-cache-groups full)"
                )
        attention = () if groups is None else parse_kv_cache_groups(groups)
        if self.bytes_per_token is not None:
            return flat_bytes(self.bytes_per_token, attention)
        return None if groups is None else groups_only(attention)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan.  Sizes: ``capacity`` (a comma list: bytes with a unit,
    tokens as a bare number, ``inf``), ``capacity_tokens`` and
    ``capacity_blocks`` (comma lists of tokens and of num_gpu_blocks,
    whatever the groups; ``inf``); none: one pool that never evicts.
    ``policies``: a comma list beside the replay's LRU
    (:data:`~blockpool.trace.plan.planner.POLICIES` or ``none``).
    ``timed``: timed mode's scheduler (its groups come from the layout).
    The planner's own flags are fields with :func:`flag` metadata; the
    others are the replay's (``blockpool trace``'s general flags)."""

    layout: LayoutRequest = field(default_factory=LayoutRequest)
    mode: str = "sequence"
    block_size: int = 16
    capacity: str | None = field(
        default=None,
        metadata=flag(
            "comma list of pool sizes: bytes per GPU with a unit (8GiB, 500MB, 1.5TB; "
            "needs --model-config or --bytes-per-token), tokens as a bare number, or 'inf'",
            "LIST",
        ),
    )
    capacity_tokens: str | None = None
    capacity_blocks: str | None = None
    policies: str = field(
        default="optimal",
        metadata=flag(
            f"beside the replay's own LRU: {', '.join(POLICIES)} or none "
            "(sequence mode; default optimal)",
            "LIST",
        ),
    )
    sweep: bool = field(
        default=False,
        metadata=flag(
            "a dense log-spaced curve (between the --capacity extremes, or "
            "from the smallest pool refusing nothing to one that never evicts)"
        ),
    )
    sweep_points: int = field(
        default=32, metadata=flag("capacities in a --sweep (default 32)", "N")
    )
    target_hit_rate: float | None = field(
        default=None,
        metadata=flag("also answer the smallest pool whose hit rate reaches RATE (0-1)", "RATE"),
    )
    hash_name: str = "sha256"
    free_order: FreeOrder = DEFAULT_FREE_ORDER
    one_pass: bool | None = None
    timed: TimedConfig | None = None


# ------------------------------------------------------------------ sizes


def groups_of(layout: KVLayout | None, block_size: int) -> list[GroupSpec] | None:
    """The layout's KV-cache groups where they are not one full-attention group."""
    if layout is None:
        return None
    specs = layout.group_specs(block_size)
    return None if is_plain(specs) else specs


def capacities_of(
    capacity: str | None,
    block_size: int,
    layout: KVLayout | None,
    legacy: Sequence[int | None] = (),
    legacy_blocks: Sequence[int | None] = (),
) -> list[Capacity]:
    """``capacity`` and the older sizes in tokens (``legacy``) and blocks
    (``legacy_blocks``: num_gpu_blocks, whatever the groups)."""
    bs = block_size
    bb = block_bytes_of(layout, bs)
    ng = 1 if layout is None else layout.num_groups
    caps = [] if capacity is None else parse_capacity_list(capacity, bs, layout)
    for tokens in legacy:
        if tokens is None:
            caps.append(Capacity("inf", None, bs, bb, ng))
        else:
            if tokens // bs < 1:
                raise ValueError(f"{tokens} tokens hold no block of {bs} tokens")
            caps.append(Capacity(str(tokens), tokens // bs * ng, bs, bb, ng))
    for b in legacy_blocks:
        caps.append(Capacity("inf" if b is None else f"{b}b", b, bs, bb, ng))
    return caps or [Capacity("inf", None, bs, bb, ng)]


def sweep_capacities(
    block_size: int,
    points: int,
    caps: list[Capacity],
    optimal: OptimalCurve,
    trace: Trace,
    groups: list[GroupSpec] | None = None,
) -> list[Capacity]:
    """``caps`` and ``points`` log-spaced sizes between their extremes (or,
    with fewer than two finite ones, the trace's own range)."""
    bs = block_size
    finite = sorted(c.blocks for c in caps if c.blocks is not None)
    if len(finite) >= 2:
        lo, hi = max(2, finite[0]), finite[-1]
    elif groups is not None:
        lo, hi = group_sweep_range(trace, groups, optimal)
    else:
        lo, hi = sweep_range(optimal)
    bb, ng = caps[0].block_bytes, caps[0].groups
    grid = log_grid(lo, hi, points)
    have = {c.blocks for c in caps}
    out = list(caps) + [Capacity(f"{b}b", b, bs, bb, ng) for b in grid if b not in have]
    out.sort(key=lambda c: float("inf") if c.blocks is None else c.blocks)
    return out


def parse_policies(text: str, mode: str) -> list[str]:
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if names == ["none"]:
        return []
    for n in names:
        if n not in POLICIES and n != "lru":
            raise ValueError(f"unknown policy {n!r} in --policies (known: {', '.join(POLICIES)})")
    names = [n for n in names if n != "lru"]
    if names and mode != "sequence":
        if text == "optimal":
            return []  # the default: only where it is a bound
        raise ValueError("--policies compare eviction policies in sequence mode only")
    return list(dict.fromkeys(names))


def usable_tokens_of(blocks: int, bs: int, layout: KVLayout | None) -> int:
    """Tokens every KV-cache group can hold in ``blocks`` (the null block left out)."""
    return (blocks - 1) // (1 if layout is None else layout.num_groups) * bs


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
