"""``blockpool replay FILE``: replay a recording (``GET /api/history/export``)
and check every result and event (``blockpool/analysis/replay.py``): the
flags give a ReplayRequest, the library its ReplayReport, printed here."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from blockpool.analysis.replay import ReplayReport, ReplayRequest, replay_recording


def add_parser(sub: Any) -> None:
    r = sub.add_parser("replay", help="replay a recording (GET /api/history/export), check it")
    r.add_argument("path", help="the JSON-lines recording")
    r.add_argument("--json", action="store_true", help="print the report as JSON")


def render(report: ReplayReport) -> str:
    """The report in words: one line, then its first problems."""
    of = f" of {report.engine}" if report.engine else ""
    lines = [
        f"{report.path}: {report.ops} ops ({report.refused} refused), "
        f"{report.keyframes} keyframes, free order {report.free_order}{of}, "
        f"{report.seconds:.2f}s: "
        + ("OK, same results, events and states" if report.ok else "MISMATCH")
    ]
    lines += [f"  - {p}" for p in report.problems[:10]]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """0: the replay matched the recording; 1: it did not; 2: the file
    could not be read or replayed."""
    try:
        report = replay_recording(ReplayRequest(args.path))
    except (OSError, ValueError, KeyError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=2) if args.json else render(report))
    return 0 if report.ok else 1
