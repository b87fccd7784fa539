"""``blockpool trace``'s capacity-planner flags: pool sizes in memory, the
optimal bound and other policies beside LRU, a dense sweep, the smallest
pool reaching a hit rate, and the table / CSV / plot they print.

``app/trace/cli.py`` calls :func:`add_planner_args` and :func:`plan`; the rest
of its flags (modes, hashing, timed mode) live there.

A layout of sliding-window KV-cache groups (a model config or layout naming
them) is replayed exactly per capacity; it has no optimum column (the
reason is printed in its place, ``optimal: null`` with ``optimal_reason`` in
the JSON), no shadow policies, and no miss reasons (hit and missed tokens).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

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
from blockpool.trace.plan.report import DEFAULT_FREE_ORDER
from blockpool.trace.replay.optimal import OptimalCurve
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.replay.sequence_groups import (
    REASONS_NOTE,
    describe_groups,
    is_plain,
    name_groups,
)
from blockpool.trace.sizing.capacity import (
    KV_CACHE_DTYPES,
    Capacity,
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

GIB = 1 << 30
PROGRESS_EVERY_S = 5.0  # a progress line this often when stderr is not a terminal


def add_planner_args(t: argparse.ArgumentParser) -> None:
    g = t.add_argument_group("capacity planning")
    g.add_argument(
        "--capacity",
        default=None,
        metavar="LIST",
        help="comma list of pool sizes: bytes per GPU with a unit (8GiB, 500MB, 1.5TB; "
        "needs --model-config or --bytes-per-token), tokens as a bare number, or 'inf'",
    )
    g.add_argument(
        "--model-config",
        default=None,
        metavar="CONFIG_JSON",
        help="a Hugging Face config.json: layers, KV heads, head size, MLA",
    )
    g.add_argument(
        "--bytes-per-token",
        type=int,
        default=None,
        metavar="N",
        help="KV bytes per token on one GPU, all layers (instead of a model)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", *KV_CACHE_DTYPES],
        help="KV cache element type, as vLLM's flag (default auto: the model's)",
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="TP",
        help="GPUs sharing the KV heads (default 1)",
    )
    g.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        help="as vLLM's flag: sliding-window layers beside full ones become full attention",
    )
    g.add_argument(
        "--disable-sliding-window",
        action="store_true",
        help="as vLLM's flag: every layer full attention (max_model_len capped at the window)",
    )
    g.add_argument(
        "--kv-cache-groups",
        default=None,
        metavar="SPEC",
        help="the KV-cache groups without a model config: comma list of full and "
        "sliding:WINDOW, each with an optional xCOUNT (full,sliding:4096x3); with "
        "--bytes-per-token N, N is a token's bytes in one group",
    )
    g.add_argument(
        "--policies",
        default="optimal",
        metavar="LIST",
        help=f"beside the replay's own LRU: {', '.join(POLICIES)} or none "
        "(sequence mode; default optimal)",
    )
    g.add_argument(
        "--sweep",
        action="store_true",
        help="a dense log-spaced curve (between the --capacity extremes, or "
        "from the smallest pool refusing nothing to one that never evicts)",
    )
    g.add_argument(
        "--sweep-points",
        type=int,
        default=32,
        metavar="N",
        help="capacities in a --sweep (default 32)",
    )
    g.add_argument(
        "--target-hit-rate",
        type=float,
        default=None,
        metavar="RATE",
        help="also answer the smallest pool whose hit rate reaches RATE (0-1)",
    )
    g.add_argument("--csv", action="store_true", help="print the table as CSV")
    g.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="draw LRU, the optimum and the unbounded ceiling (the plot extra)",
    )
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")


# ------------------------------------------------------------------ progress


class Progress:
    """Progress of each phase on stderr (None: off).

    On a terminal, one bar per phase redrawn in place (label, rate, ETA).
    Anywhere else (a log, a pipe, CI), a plain line every ``every`` seconds
    per phase -- done/total, rate, elapsed, ETA -- and a last one when a
    phase that printed ends, so a long run is never silent.  ``clock``:
    seconds (``time.monotonic``)."""

    def __init__(
        self,
        stream: TextIO | None,
        tty: bool = True,
        every: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.tty = tty
        self.every = every
        self.clock = clock

    def bar(self, label: str, unit: str = "req") -> Callable[[int, int], None] | None:
        stream = self.stream
        if stream is None:
            return None
        clock, tty, every = self.clock, self.tty, self.every
        t0 = clock()
        last = [t0 if not tty else t0 - 1.0]
        printed = [False]

        def show(done: int, total: int) -> None:
            now = clock()
            end = done >= total
            if end and not tty and not printed[0]:
                return  # a phase over before its first line: nothing to say
            if not end and now - last[0] < (0.1 if tty else every):
                return
            last[0] = now
            el = now - t0
            frac = done / total if total else 1.0
            rate = done / el if el > 0 else 0.0
            eta = (total - done) / rate if rate > 0 else None
            left = "not known" if eta is None else f"{eta:.1f}s"
            if tty:
                bar = "#" * int(frac * 24)
                stream.write(
                    f"\r{label} [{bar:<24}] {done}/{total} {unit} {rate:,.0f}/s "
                    f"{el:5.1f}s ETA {left}"
                )
                if end:
                    stream.write("\n")
            else:
                printed[0] = True
                stream.write(
                    f"{label}: {done:,}/{total:,} {unit} ({100 * frac:.0f}%), {rate:,.1f} "
                    f"{unit}/s, {el:.1f}s elapsed, " + ("done\n" if end else f"ETA {left}\n")
                )
            stream.flush()

        return show


def progress_for(args: argparse.Namespace, stream: TextIO | None = None) -> Progress:
    """Progress on stderr unless ``--quiet`` / ``--no-progress``: a bar on a
    terminal, a line every few seconds elsewhere (``--progress``: the bar)."""
    stream = sys.stderr if stream is None else stream
    if getattr(args, "quiet", False) or args.progress is False:
        return Progress(None)
    return Progress(stream, tty=bool(args.progress) or stream.isatty())


# ---------------------------------------------------------------- capacities


def layout_of(args: argparse.Namespace) -> KVLayout | None:
    if args.model_config and args.bytes_per_token is not None:
        raise ValueError("give --model-config or --bytes-per-token, not both")
    groups = getattr(args, "kv_cache_groups", None)
    if args.model_config:
        if groups is not None:
            raise ValueError("--kv-cache-groups is for runs without --model-config")
        return read_model_config(
            args.model_config,
            args.kv_cache_dtype,
            args.tensor_parallel_size,
            disable_sliding_window=getattr(args, "disable_sliding_window", False),
            disable_hybrid_kv_cache_manager=getattr(args, "disable_hybrid_kv_cache_manager", False),
        )
    for flag in ("disable_sliding_window", "disable_hybrid_kv_cache_manager"):
        if getattr(args, flag, False):
            raise ValueError(
                f"--{flag.replace('_', '-')} acts on a --model-config's layers "
                "(without one, name the groups: --kv-cache-groups full)"
            )
    attention = () if groups is None else parse_kv_cache_groups(groups)
    if args.bytes_per_token is not None:
        return flat_bytes(args.bytes_per_token, attention)
    return None if groups is None else groups_only(attention)


def capacities_of(
    args: argparse.Namespace,
    layout: KVLayout | None,
    legacy: list[int | None],
    legacy_blocks: Sequence[int | None] = (),
) -> list[Capacity]:
    """``--capacity`` and the older ``--capacity-tokens`` / ``--capacity-blocks``
    (``legacy_blocks``: num_gpu_blocks, whatever the groups)."""
    bs = args.block_size
    bb = block_bytes_of(layout, bs)
    ng = 1 if layout is None else layout.num_groups
    caps = [] if args.capacity is None else parse_capacity_list(args.capacity, bs, layout)
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
    args: argparse.Namespace,
    caps: list[Capacity],
    optimal: OptimalCurve,
    trace: Trace,
    groups: list[GroupSpec] | None = None,
) -> list[Capacity]:
    bs = args.block_size
    finite = sorted(c.blocks for c in caps if c.blocks is not None)
    if len(finite) >= 2:
        lo, hi = max(2, finite[0]), finite[-1]
    elif groups is not None:
        lo, hi = group_sweep_range(trace, groups, optimal)
    else:
        lo, hi = sweep_range(trace, bs, optimal)
    bb, ng = caps[0].block_bytes, caps[0].groups
    grid = log_grid(lo, hi, args.sweep_points)
    have = {c.blocks for c in caps}
    out = list(caps) + [Capacity(f"{b}b", b, bs, bb, ng) for b in grid if b not in have]
    out.sort(key=lambda c: float("inf") if c.blocks is None else c.blocks)
    return out


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


def groups_of(layout: KVLayout | None, block_size: int) -> list[GroupSpec] | None:
    """The layout's KV-cache groups where they are not one full-attention group."""
    if layout is None:
        return None
    specs = layout.group_specs(block_size)
    return None if is_plain(specs) else specs


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
    plan: Plan, trace: Trace, block_size: int, results: list[CapacityResult], progress: Progress
) -> None:
    """The optimum (and the shadows' policies) at every capacity, into ``extra``;
    over KV-cache groups only the unbounded ceiling (which bounds them too)."""
    t0 = time.perf_counter()
    keys = BlockKeys(trace, block_size)
    opt = plan.optimal = OptimalCurve(trace, block_size, keys)
    plan.unbounded_hit_tokens = group_unbounded_hit_tokens(trace, block_size, opt)
    usable = [c.usable_blocks for c in plan.caps]
    if "optimal" in plan.policies:
        hits = opt.hit_tokens(usable, progress.bar("optimal", "capacities"))
        for r, h in zip(results, hits, strict=True):
            r.extra["optimal_hit_tokens"] = h
            r.extra["optimal_hit_rate"] = h / r.prompt_tokens if r.prompt_tokens else 0.0
        plan.seconds["optimal"] = time.perf_counter() - t0
    for pol in plan.policies:
        if pol not in SHADOW_POLICIES:
            continue
        t1 = time.perf_counter()
        got = shadow_curve(trace, block_size, keys, pol, usable, progress.bar(pol, "capacities"))
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


# ------------------------------------------------------------------- output


def _rate(v: Any) -> str:
    return "" if v is None else f"{100 * v:.2f}"


def _num(v: Any) -> str:
    return "inf" if v is None else str(v)


def columns(results: list[CapacityResult], plan: Plan | None) -> list[tuple[str, str, Any]]:
    """(table header with its unit, CSV name, value of a result)."""
    pols = [] if plan is None else plan.policies
    cols: list[tuple[str, str, Any]] = [
        ("usable (tokens)", "usable_tokens", lambda r: r.extra.get("usable_tokens")),
        ("blocks (num_gpu_blocks)", "blocks", lambda r: r.blocks),
    ]
    if plan is not None and plan.groups is not None:
        cols.append(
            ("vLLM KV cache (tokens)", "kv_cache_tokens", lambda r: r.extra.get("kv_cache_tokens"))
        )
    if plan is not None and block_bytes_of(plan.layout, 16) is not None:
        cols.append(("memory (GiB)", "memory_bytes", lambda r: r.extra.get("bytes")))
    cols.append(("asked", "capacity", lambda r: r.extra.get("capacity", _num(r.capacity_tokens))))
    cols += [
        ("prompt (tokens)", "prompt_tokens", lambda r: r.prompt_tokens),
        ("hits LRU (tokens)", "lru_hit_tokens", lambda r: r.hit_tokens),
        ("LRU (%)", "lru_hit_rate", lambda r: r.hit_rate),
    ]
    if "optimal" in pols:
        cols.append(("optimal (%)", "optimal_hit_rate", lambda r: r.extra.get("optimal_hit_rate")))
    for p in pols:
        if p != "optimal":
            cols.append((f"{p} (%)", f"{p}_hit_rate", lambda r, p=p: r.extra.get(f"{p}_hit_rate")))
    if plan is not None and plan.unbounded_hit_tokens is not None:
        cols.append(
            ("unbounded (%)", "unbounded_hit_rate", lambda r: r.extra.get("unbounded_hit_rate"))
        )
    if "optimal" in pols:
        cols.append(
            (
                "gap opt-LRU (pt)",
                "optimal_gap_rate",
                lambda r: (
                    None
                    if "optimal_hit_rate" not in r.extra
                    else r.extra["optimal_hit_rate"] - r.hit_rate
                ),
            )
        )
    cols += [
        ("evictions (blocks)", "evictions_blocks", lambda r: r.evictions),
        ("refused (requests)", "refused_requests", lambda r: r.refused),
        ("cold (blocks)", "cold_blocks", _reason("cold")),
        ("evicted (blocks)", "evicted_blocks", _reason("evicted")),
        ("last token (blocks)", "last_token_blocks", _reason("last_token")),
        ("floor (blocks)", "block_size_floor_blocks", _reason("block_size_floor")),
        ("regret (blocks)", "regret_blocks", _reason(None)),
    ]
    return cols


def _reason(name: str | None) -> Callable[[CapacityResult], Any]:
    """A miss-reason column (``None``: regret); empty where none are classified."""

    def value(r: CapacityResult) -> Any:
        if not r.classified:
            return ""
        return r.regret_blocks if name is None else r.miss_reasons[name]

    return value


def _cell(header: str, v: Any) -> str:
    if header.endswith("(%)") or header.endswith("(pt)"):
        return "—" if v is None else _rate(v)
    if header == "memory (GiB)":
        return "inf" if v is None else f"{v / GIB:.2f}"
    if isinstance(v, str):
        return v or "—"
    return _num(v)


def table_lines(results: list[CapacityResult], plan: Plan | None) -> list[str]:
    cols = columns(results, plan)
    rows = [[h for h, _, _ in cols]]
    for r in results:
        rows.append([_cell(h, f(r)) for h, _, f in cols])
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    return ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]


def render_csv(
    results: list[CapacityResult], plan: Plan | None, mode: str, free_order: str | None = None
) -> str:
    """One row per capacity; rates as fractions 0-1, sizes in tokens, blocks, bytes
    (and the replay's free order, when given)."""
    cols = columns(results, plan)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    why = [] if plan is None or plan.groups is None else [NO_OPTIMUM]
    order = [] if free_order is None else [free_order]
    w.writerow(
        [n for _, n, _ in cols]
        + ["preemptions", "mode"]
        + ["free_order"] * len(order)
        + ["optimal_reason"] * len(why)
    )
    for r in results:
        vals = []
        for _, _, f in cols:
            v = f(r)
            vals.append("inf" if v is None else v)
        w.writerow([*vals, r.preemptions, mode, *order, *why])
    return buf.getvalue()


def target_lines(plan: Plan, block_size: int) -> list[str]:
    t = plan.target
    if t is None:
        return []
    layout = plan.layout

    def say(b: int | None) -> str:
        if b is None:
            return "not reached"
        s = f"{b:,} blocks = {usable_tokens_of(b, block_size, layout):,} usable tokens"
        bb = block_bytes_of(layout, block_size)
        if bb is not None:
            s += f" = {b * bb / GIB:.2f} GiB per GPU"
        return s

    if t.lru_blocks is None and t.optimal_blocks is None:
        return [
            f"target hit rate {t.target:.1%}: not reachable at any size "
            f"(unbounded: {t.unbounded_hit_rate:.1%})"
        ]
    if t.optimal_reason is not None:
        return [
            f"target hit rate {t.target:.1%}: LRU needs {say(t.lru_blocks)}; no optimum",
            f"  search: {t.search}",
        ]
    return [
        f"target hit rate {t.target:.1%}: LRU needs {say(t.lru_blocks)}; "
        f"the optimal policy {say(t.optimal_blocks)}"
    ]


def find_target(
    plan: Plan,
    trace: Trace,
    block_size: int,
    target: float,
    progress: Progress,
    hash_name: str = "sha256",
    free_order: FreeOrder = DEFAULT_FREE_ORDER,
) -> None:
    t0 = time.perf_counter()
    bar = progress.bar("target", "passes")
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


def group_lines(plan: Plan) -> list[str]:
    """The KV-cache groups and what the table lacks over them."""
    if plan.groups is None:
        return []
    return [
        f"KV-cache groups: {name_groups(plan.groups)}; vLLM's token capacity = "
        f"num_gpu_blocks // {len(plan.groups)} x block size",
        f"optimal: none -- {NO_OPTIMUM}",
        *([REASONS_NOTE] if plan.mode == "sequence" else []),
    ]
