"""``blockpool`` command line: ``blockpool serve`` starts the service,
``blockpool observe`` follows vLLM KV-event streams.

Flags override ``BLOCKPOOL_*`` environment settings, which override defaults.

This package: the parser and the dispatch; the flags of each command
(serve_flags, observe_flags, serving_flags), their generated defaults
(help_defaults), the settings they give (settings), the commands
(commands) and the uvicorn run (server).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from app.cli.commands import observe, serve
from app.cli.observe_flags import add_observe_parser
from app.cli.serve_flags import add_serve_parser
from app.trace import cli as cli_trace

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="blockpool", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_observe_parser(sub)
    r = sub.add_parser("replay", help="replay a recording (GET /api/history/export), check it")
    r.add_argument("path", help="the JSON-lines recording")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    cli_trace.add_parser(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "observe":
        return observe(args)
    if args.command == "replay":
        from blockpool.analysis.replay import main as replay_main

        return replay_main([args.path, *(["--json"] if args.json else [])])
    if args.command == "trace":
        return cli_trace.main(args)
    return 2  # pragma: no cover - argparse enforces the subcommands
