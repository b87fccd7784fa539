"""``blockpool trace FILE``: replay a production trace offline (no server).

Prints, per capacity, the prompt and hit tokens, the hit rate (LRU, the
offline optimum, the unbounded ceiling), evictions, refused requests, miss
reasons and regret; ``--json`` prints one JSON document, ``--csv`` a CSV.
The capacity-planning flags are in ``app/trace/planner.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.cli import trace_fleet
from app.cli.field_flags import add_field_flags, flag, flag_fields, from_args
from app.cli.flag_table import Flag, add_flags
from app.cli.trace_sched import add_scheduler_arguments, scheduler_lines, timed_config
from app.trace import planner
from blockpool.core.free_order import FreeOrder
from blockpool.core.hashing import HashName
from blockpool.trace import TraceError, read_trace
from blockpool.trace.plan import capacity_plan
from blockpool.trace.plan.plan_request import LayoutRequest, PlanRequest
from blockpool.trace.plan.report import (
    DEFAULT_FREE_ORDER,
    Mode,
    TraceReport,
    free_order_label,
)


@dataclass(frozen=True)
class TraceFlags:
    """The trace command's general flags, one a field (name, type, default,
    choices and help: ``field_flags``); read as parsed."""

    mode: Mode = field(default="sequence", metadata=flag("(default sequence)"))
    block_size: int = field(default=16, metadata=flag("tokens per block (16)"))
    capacity_tokens: str | None = field(
        default=None,
        metadata=flag("comma list of pool sizes in tokens, 'inf' = never evicts (default inf)"),
    )
    capacity_blocks: str | None = field(
        default=None, metadata=flag("comma list of pool sizes in blocks")
    )
    hash_name: HashName = field(
        default="sha256", metadata=flag("block hash function (default sha256)", option="--hash")
    )
    free_order: FreeOrder = field(
        default=DEFAULT_FREE_ORDER,
        metadata=flag(
            "where freed blocks enter the free queue (default uncached_first: "
            "vLLM >= 0.24; append_all: vLLM 0.16)"
        ),
    )
    speed: float = field(default=1.0, metadata=flag("timed: arrivals x speed (1)"))
    step_ms: float = field(default=20.0, metadata=flag("timed: ms per step (20)"))
    max_running: int = field(default=256, metadata=flag("timed: running limit (256)"))
    tokens_per_id: int = field(default=512, metadata=flag("tokens per hash id (512)"))
    one_pass: bool | None = field(
        default=None,
        metadata=flag(
            "sequence: one real pool per capacity instead of the one-pass curve",
            option="--no-one-pass",
        ),
    )
    json: bool = field(default=False, metadata=flag("print one JSON document"))
    progress: bool | None = field(
        default=None,
        metadata={
            **flag(
                "a progress bar on stderr even when it is not a terminal (default: a bar "
                "on a terminal, elsewhere a line every few seconds)"
            ),
            "off": ("--no-progress", "no progress on stderr"),
        },
    )


@dataclass(frozen=True)
class OutputFlags:
    """How the plan's answer is printed (the capacity-planning group's last
    flags; ``field_flags``)."""

    csv: bool = field(default=False, metadata=flag("print the table as CSV"))
    plot: str | None = field(
        default=None,
        metadata=flag("draw LRU, the optimum and the unbounded ceiling (the plot extra)", "PNG"),
    )
    quiet: bool = field(default=False, metadata=flag("no progress on stderr"))


def add_parser(sub: Any) -> None:
    t = sub.add_parser(
        "trace",
        help="replay a Mooncake trace (or a recording) offline: hit rate per capacity",
        description=__doc__.split("\n\n")[0],
    )
    t.add_argument("path", metavar="FILE", help="Mooncake JSON lines, or a recording export")
    add_field_flags(t, TraceFlags)
    add_scheduler_arguments(t)
    add_planner_args(t)
    trace_fleet.add_fleet_args(t)


def add_planner_args(t: argparse.ArgumentParser) -> None:
    """The capacity-planning flags: generated from the request's fields (the
    capacity list, the layout's, then the planner's questions), and how the
    answer is printed."""
    g = t.add_argument_group("capacity planning")
    add_field_flags(g, PlanRequest, ["capacity"])
    add_field_flags(g, LayoutRequest)
    add_field_flags(g, PlanRequest, [n for n in flag_fields(PlanRequest) if n != "capacity"])
    add_field_flags(g, OutputFlags)


def layout_request(args: argparse.Namespace) -> LayoutRequest:
    """The KV layout the flags name."""
    request: LayoutRequest = from_args(LayoutRequest, args)
    return request


def request_of(args: argparse.Namespace) -> PlanRequest:
    """The plan the flags ask for (timed mode's scheduler: ``trace_sched``)."""
    request: PlanRequest = from_args(PlanRequest, args, layout=layout_request(args), timed=None)
    return request


SERVE_FLAGS = (
    Flag("--trace", "drive the engine from this trace instead of the demo"),
    Flag("--trace-speed", "trace arrivals x speed", type=float),
    Flag(
        "--trace-loop",
        "start the trace over when it ends",
        dest="trace_loop",
        action="store_true",
        default=None,
    ),
)


def add_serve_flags(s: argparse.ArgumentParser) -> None:
    add_flags(s, SERVE_FLAGS)


def _fmt_cap(v: int | None) -> str:
    return "inf" if v is None else str(v)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f}s"
    m, s = divmod(seconds, 60)
    return f"{int(m)}m{s:04.1f}s"


def render(
    report: TraceReport,
    path: str,
    plan: capacity_plan.Plan | None = None,
    wall_seconds: float | None = None,
) -> str:
    took = f"replay {_duration(report.seconds)}"
    if wall_seconds is not None:  # the whole command: reading, optimum, target search
        took += f", all {_duration(wall_seconds)}"
    lines = [
        f"trace: {path} ({report.info['requests']} requests, tokens per id "
        f"{report.info['tokens_per_id']})",
        f"mode: {report.mode}, block size {report.block_size}, hash {report.hash_fn}, "
        f"free order {free_order_label(report.free_order)}; {took}",
        report.note + (f" ({report.info['stacks']} stack(s))" if "stacks" in report.info else ""),
        "",
    ]
    lines += planner.table_lines(report.results, plan)
    if plan is not None:
        lines += planner.group_lines(plan)
        lines += planner.target_lines(plan, report.block_size)
    if report.mode == "timed":
        pre = ", ".join(
            f"{r.extra.get('capacity', _fmt_cap(r.capacity_tokens))}: {r.preemptions}"
            for r in report.results
        )
        lines.append(f"preemptions: {pre}")
    lines += scheduler_lines(report)
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if args.replicas is not None:
        return trace_fleet.main(args)
    started = time.perf_counter()
    try:
        setup = capacity_plan.prepare(request_of(args))
        trace = read_trace(args.path, args.tokens_per_id)
        progress = planner.progress_for(args)
        plan = setup.plan_for(trace)
        timed = timed_config(args, setup.layout)
        result = capacity_plan.run_plan(setup, plan, trace, timed, progress.bar)
        report = result.report
        if args.plot:
            from app.trace.plot import plot_curve

            plot_curve(report, plan, args.plot, title=Path(args.path).name)
    except ValueError as exc:  # a TraceError names the file
        where = f"{args.path}: " if isinstance(exc, TraceError) else ""
        print(f"blockpool trace: {where}{exc}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - started
    if args.json:
        doc = {"file": args.path, **result.to_json()}
        print(json.dumps({**doc, "wall_seconds": wall}))
    elif args.csv:
        csv_text = planner.render_csv(report.results, plan, report.mode, report.free_order)
        sys.stdout.write(csv_text)
    else:
        print(render(report, args.path, plan, wall))
    return 0
