"""``blockpool replay FILE``: replay a recording (``GET /api/history/export``)
and check every result and event (``blockpool/analysis/replay.py``)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    r = sub.add_parser("replay", help="replay a recording (GET /api/history/export), check it")
    r.add_argument("path", help="the JSON-lines recording")
    r.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    from blockpool.analysis.replay import main as replay_main

    return replay_main([args.path, *(["--json"] if args.json else [])])
