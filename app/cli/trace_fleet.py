"""``blockpool trace FILE --replicas 1,2,4 --capacity 40GiB,80GiB --router ...``:
fleet planning.

Each configuration (replicas x capacity per replica x router x free order)
is replayed with every replica an exact pool of its own
(``blockpool/trace/fleet/``); the sweep runs on local processes
(``--workers``), in this process (``--executor serial``) or on Ray
(``--executor ray --ray-address ...``).  Prints a table (or ``--csv``,
``--json``), draws ``--plot``, and with ``--target-hit-rate`` /
``--target-ttft-p99`` answers the smallest fleet of the sweep meeting them.
Timed mode takes the scheduler flags of ``trace_sched.py``; its step model
from them, from ``--step-model`` or fitted from a saved ``/metrics`` scrape
(``--step-model-metrics``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app.cli.field_flags import add_field_flags, from_args
from app.cli.trace_sched import timed_config
from app.trace import planner
from app.trace.fleet_output import render_csv, render_json, render_table
from blockpool.core.free_order import FREE_ORDERS
from blockpool.trace import TraceError, parse_capacities, read_trace
from blockpool.trace.fleet import (
    ROUTERS,
    FleetJob,
    FleetSpec,
    parse_routers,
    run_sweep,
)
from blockpool.trace.fleet.routers import DEFAULT_OVERLAP_WEIGHT, DEFAULT_SESSION_IDS
from blockpool.trace.fleet.stepfit import fit_from_scrape, read_scrape
from blockpool.trace.fleet.sweep import Executor
from blockpool.trace.fleet.targets import FleetTarget, check_targets, smallest_fleet
from blockpool.trace.plan.plan_request import LayoutRequest, flag
from blockpool.trace.plan.pool_sizes import capacities_of, groups_of
from blockpool.trace.replay.sequence_groups import is_plain
from blockpool.trace.sizing.capacity import Capacity, KVLayout

MAX_REPLICAS = 4096


@dataclass(frozen=True)
class FleetFlags:
    """The fleet sweep's flags, one a field (name, type, default, choices and
    help: ``field_flags``); ``build`` and ``main`` read them as parsed."""

    replicas: str | None = field(
        default=None,
        metadata=flag(
            "comma list of replica counts (1,2,4,8): plan fleets, each replica "
            "an exact pool of --capacity",
            "LIST",
        ),
    )
    router: str = field(
        default=",".join(ROUTERS),
        metadata=flag(f"comma list of routers: {', '.join(ROUTERS)} (default all)", "LIST"),
    )
    overlap_weight: float = field(
        default=DEFAULT_OVERLAP_WEIGHT,
        metadata=flag(
            "prefix_aware: cost = W x uncached prompt blocks + load blocks "
            "(Dynamo's kv-overlap-score-weight; default 1.0)",
            "W",
        ),
    )
    session_ids: int = field(
        default=DEFAULT_SESSION_IDS,
        metadata=flag("session: the key is a request's first N hash ids (default 1)", "N"),
    )
    free_orders: str | None = field(
        default=None,
        metadata=flag(
            f"fleet: sweep these free orders ({', '.join(FREE_ORDERS)}; default: --free-order)",
            "LIST",
        ),
    )
    executor: Executor = field(
        default="process",
        metadata=flag("where the sweep's replays run (default process: local processes)"),
    )
    workers: int | None = field(
        default=None,
        metadata=flag("processes, or Ray CPUs for a local Ray (default: the CPUs)", "N"),
    )
    ray_address: str | None = field(
        default=None,
        metadata=flag(
            "--executor ray: a cluster to join (ray://head:10001, head:6379, "
            "auto); default: a local Ray on 127.0.0.1",
            "ADDR",
        ),
    )
    assignments: bool = field(
        default=False,
        metadata=flag("--json: each configuration's replica of every request, in trace order"),
    )
    target_ttft_p99: float | None = field(
        default=None,
        metadata=flag("timed: also answer the smallest fleet whose TTFT p99 is at most MS", "MS"),
    )
    step_model_metrics: str | None = field(
        default=None,
        metadata=flag(
            "timed: fit the step model from a saved vLLM /metrics scrape "
            "(iteration tokens and TTFT histograms)",
            "SCRAPE",
        ),
    )


def add_fleet_args(t: argparse.ArgumentParser) -> None:
    g = t.add_argument_group("fleet planning (replicas behind a router)")
    add_field_flags(g, FleetFlags)


def _int_list(text: str, flag: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        p = part.strip()
        if not p:
            continue
        try:
            v = int(p)
        except ValueError:
            raise ValueError(f"{flag}: not an integer: {p!r}") from None
        if not 1 <= v <= MAX_REPLICAS:
            raise ValueError(f"{flag}: {v} is not in 1..{MAX_REPLICAS}")
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError(f"{flag}: no value given")
    return out


def _free_orders(args: argparse.Namespace) -> list[str]:
    if args.free_orders is None:
        return [args.free_order]
    out = [p.strip() for p in args.free_orders.split(",") if p.strip()]
    for p in out:
        if p not in FREE_ORDERS:
            raise ValueError(f"--free-orders: unknown {p!r} (known: {', '.join(FREE_ORDERS)})")
    if not out:
        raise ValueError("--free-orders: no value given")
    return list(dict.fromkeys(out))


def _capacities(args: argparse.Namespace, layout: KVLayout | None) -> list[Capacity]:
    legacy = parse_capacities(args.capacity_tokens) if args.capacity_tokens else []
    legacy_b = parse_capacities(args.capacity_blocks) if args.capacity_blocks else []
    return capacities_of(args.capacity, args.block_size, layout, legacy, legacy_b)


def _refuse(args: argparse.Namespace) -> None:
    if args.sweep:
        raise ValueError("--sweep is for one pool; with --replicas give the --capacity list")
    if args.workers is not None and args.workers < 1:
        raise ValueError("--workers must be >= 1")
    if args.ray_address is not None and args.executor != "ray":
        raise ValueError("--ray-address needs --executor ray")
    if args.session_ids < 1:
        raise ValueError("--session-ids must be >= 1")
    if args.target_ttft_p99 is not None and args.mode != "timed":
        raise ValueError("--target-ttft-p99 needs --mode timed (TTFT is simulated there)")
    if args.step_model_metrics and args.mode != "timed":
        raise ValueError("--step-model-metrics needs --mode timed")
    if args.step_model_metrics and args.step_model:
        raise ValueError("give --step-model or --step-model-metrics, not both")


def build(args: argparse.Namespace) -> tuple[FleetSpec, list[FleetJob], dict[str, Any]]:
    """The spec and jobs the flags ask for (ValueError naming the flag when bad)."""
    _refuse(args)
    check_targets(args.target_hit_rate, args.target_ttft_p99)
    layout = from_args(LayoutRequest, args).layout()
    groups = groups_of(layout, args.block_size)
    if not is_plain(groups):
        raise ValueError("fleet planning models one full-attention KV-cache group")
    replicas = _int_list(args.replicas, "--replicas")
    routers = parse_routers(args.router)
    orders = _free_orders(args)
    caps = _capacities(args, layout)
    info: dict[str, Any] = {}
    timed = timed_config(args, layout)
    if args.step_model_metrics:
        fit = fit_from_scrape(read_scrape(args.step_model_metrics))
        timed = replace(timed, step_model=fit.model)
        info["step_model_fit"] = {"source": args.step_model_metrics, **fit.to_json()}
    spec = FleetSpec(
        mode=args.mode,
        block_size=args.block_size,
        hash_name=args.hash_name,
        overlap_weight=args.overlap_weight,
        session_ids=args.session_ids,
        timed=timed,
    )
    jobs = [
        FleetJob(n, c.label, c.blocks, r, fo, c.block_bytes)
        for fo in orders
        for c in caps
        for n in replicas
        for r in routers
    ]
    return spec, jobs, info


def main(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        spec, jobs, info = build(args)
        trace = read_trace(args.path, args.tokens_per_id)
        progress = planner.progress_for(args)
        bar = progress.bar(f"fleet sweep ({len(jobs)} configurations)", unit="config")
        results = run_sweep(
            trace, spec, jobs, executor=args.executor, workers=args.workers,
            ray_address=args.ray_address, done=bar,
        )  # fmt: skip
        target: FleetTarget | None = None
        if args.target_hit_rate is not None or args.target_ttft_p99 is not None:
            target = smallest_fleet(results, args.target_hit_rate, args.target_ttft_p99)
        if args.plot:
            from app.trace.fleet_plot import plot_fleet

            plot_fleet(results, args.plot, target, title=Path(args.path).name)
    except ValueError as exc:  # a TraceError names the file
        where = f"{args.path}: " if isinstance(exc, TraceError) else ""
        print(f"blockpool trace: {where}{exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - t0
    head = {"file": args.path, "requests": len(trace), "seconds": seconds,
            "executor": args.executor, **info}  # fmt: skip
    if args.json:
        print(json.dumps(render_json(head, spec, results, target, args.assignments)))
    elif args.csv:
        sys.stdout.write(render_csv(results))
    else:
        print(render_table(head, spec, results, target))
    return 0
