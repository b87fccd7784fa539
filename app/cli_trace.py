"""``blockpool trace FILE``: replay a production trace offline (no server).

Prints, per capacity, the prompt and hit tokens, the hit rate, evictions,
refused requests and miss reasons; ``--json`` prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from app.cli_trace_sched import add_scheduler_arguments, scheduler_lines, timed_config
from blockpool.hashing import HASH_FUNCTIONS
from blockpool.trace import TraceError, parse_capacities, read_trace
from blockpool.trace.replay import MODES, TraceReport, replay_trace
from blockpool.trace.sequence import FREE_ORDERS


def add_parser(sub: Any) -> None:
    t = sub.add_parser(
        "trace",
        help="replay a Mooncake trace (or a recording) offline: hit rate per capacity",
        description=__doc__.split("\n\n")[0],
    )
    t.add_argument("path", metavar="FILE", help="Mooncake JSON lines, or a recording export")
    t.add_argument("--mode", choices=MODES, default="sequence", help="(default sequence)")
    t.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    t.add_argument(
        "--capacity-tokens", default=None,
        help="comma list of pool sizes in tokens, 'inf' = never evicts (default inf)",
    )  # fmt: skip
    t.add_argument("--capacity-blocks", default=None, help="comma list of pool sizes in blocks")
    t.add_argument("--hash", dest="hash_name", choices=sorted(HASH_FUNCTIONS), default="sha256")
    t.add_argument("--free-order", choices=FREE_ORDERS, default="append_all")
    t.add_argument("--speed", type=float, default=1.0, help="timed: arrivals x speed (1)")
    t.add_argument("--step-ms", type=float, default=20.0, help="timed: ms per step (20)")
    t.add_argument("--max-running", type=int, default=256, help="timed: running limit (256)")
    t.add_argument("--tokens-per-id", type=int, default=512, help="tokens per hash id (512)")
    t.add_argument(
        "--no-one-pass", dest="one_pass", action="store_false", default=None,
        help="sequence: one real pool per capacity instead of the one-pass curve",
    )  # fmt: skip
    t.add_argument("--json", action="store_true", help="print one JSON document")
    t.add_argument(
        "--progress", dest="progress", action="store_true", default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )  # fmt: skip
    t.add_argument("--no-progress", dest="progress", action="store_false")
    add_scheduler_arguments(t)


def add_serve_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--trace", help="drive the engine from this trace instead of the demo")
    s.add_argument("--trace-speed", type=float, help="trace arrivals x speed")
    _flag = s.add_argument
    _flag("--trace-loop", dest="trace_loop", action="store_true", default=None,
          help="start the trace over when it ends")  # fmt: skip


def _capacities(args: argparse.Namespace) -> list[int | None]:
    caps: list[int | None] = []
    if args.capacity_tokens:
        caps += parse_capacities(args.capacity_tokens)
    if args.capacity_blocks:
        caps += [None if b is None else b * args.block_size for b in parse_capacities(
            args.capacity_blocks)]  # fmt: skip
    return caps or [None]


def progress_bar(stream: TextIO, label: str) -> Callable[[int, int], None]:
    t0 = time.monotonic()

    def show(done: int, total: int) -> None:
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        stream.write(f"\r{label} [{bar:<30}] {done}/{total} {time.monotonic() - t0:5.1f}s")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show


def _fmt_cap(v: int | None) -> str:
    return "inf" if v is None else str(v)


def render(report: TraceReport, path: str) -> str:
    lines = [
        f"trace: {path} ({report.info['requests']} requests, tokens per id "
        f"{report.info['tokens_per_id']})",
        f"mode: {report.mode}, block size {report.block_size}, hash {report.hash_fn}, "
        f"free order {report.free_order}; {report.seconds:.2f}s",
        report.note + (f" ({report.info['stacks']} stack(s))" if "stacks" in report.info else ""),
        "",
    ]
    head = ("capacity_tokens", "blocks", "prompt_tokens", "hit_tokens", "hit_rate", "evictions",
            "refused", "cold", "evicted", "last_token", "floor")  # fmt: skip
    rows = [head]
    for r in report.results:
        m = r.miss_reasons
        rows.append((
            _fmt_cap(r.capacity_tokens), _fmt_cap(r.blocks), str(r.prompt_tokens),
            str(r.hit_tokens), f"{r.hit_rate:.4f}", str(r.evictions), str(r.refused),
            str(m["cold"]), str(m["evicted"]), str(m["last_token"]), str(m["block_size_floor"]),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    if report.mode == "timed":
        pre = ", ".join(f"{_fmt_cap(r.capacity_tokens)}: {r.preemptions}" for r in report.results)
        lines.append(f"preemptions: {pre}")
    lines += scheduler_lines(report)
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        caps = _capacities(args)
        trace = read_trace(args.path, args.tokens_per_id)
        show = args.progress if args.progress is not None else sys.stderr.isatty()
        report = replay_trace(
            trace,
            mode=args.mode,
            block_size=args.block_size,
            capacities_tokens=caps,
            hash_name=args.hash_name,
            free_order=args.free_order,
            timed=timed_config(args),
            one_pass=args.one_pass,
            progress=progress_bar(sys.stderr, args.mode) if show else None,
        )
    except TraceError as exc:
        print(f"blockpool trace: {args.path}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"blockpool trace: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"file": args.path, **report.to_json()}))
    else:
        print(render(report, args.path))
    return 0
