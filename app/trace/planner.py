"""What ``blockpool trace`` prints of a capacity plan
(:class:`~blockpool.trace.plan.capacity_plan.PlanResult`, planned in the
library): the table, the CSV, the target's and the groups' lines, and the
progress on stderr.  The flags and the request they make are
``app/cli/trace.py``'s.

A layout of sliding-window KV-cache groups has no optimum column (the
reason is printed in its place) and no miss reasons (hit and missed tokens).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from blockpool.trace.plan.capacity_plan import Plan
from blockpool.trace.plan.planner import NO_OPTIMUM
from blockpool.trace.plan.pool_sizes import usable_tokens_of
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.replay.sequence_groups import REASONS_NOTE, name_groups
from blockpool.trace.sizing.capacity import block_bytes_of

GIB = 1 << 30
PROGRESS_EVERY_S = 5.0  # a progress line this often when stderr is not a terminal


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


# ------------------------------------------------------------------- output


def _rate(v: Any) -> str:
    return "" if v is None else f"{100 * v:.2f}"


def _num(v: Any) -> str:
    return "inf" if v is None else str(v)


def columns(plan: Plan | None) -> list[tuple[str, str, Any]]:
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
    cols = columns(plan)
    rows = [[h for h, _, _ in cols]]
    rows.extend([_cell(h, f(r)) for h, _, f in cols] for r in results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    return ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]


def render_csv(
    results: list[CapacityResult], plan: Plan | None, mode: str, free_order: str | None = None
) -> str:
    """One row per capacity; rates as fractions 0-1, sizes in tokens, blocks, bytes
    (and the replay's free order, when given)."""
    cols = columns(plan)
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
