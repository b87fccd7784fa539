"""``blockpool`` command line: ``blockpool serve`` starts the service,
``blockpool observe`` follows vLLM KV-event streams.

Flags override ``BLOCKPOOL_*`` environment settings, which override defaults.

This package: the parser and the dispatch; the flags of each command
(serve_flags, observe_flags, serving_flags: tables of flag_table's rows),
their generated defaults (help_defaults), the settings they give
(settings), the commands (commands) and the uvicorn run (server);
``replay`` (replay) and ``trace`` (trace, with trace_sched: timed mode's
scheduler, trace_fleet: --replicas).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from app.cli import replay as cli_replay
from app.cli import trace as cli_trace
from app.cli.commands import observe, serve
from app.cli.observe_flags import add_observe_parser
from app.cli.serve_flags import add_serve_parser

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="blockpool", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_observe_parser(sub)
    cli_replay.add_parser(sub)
    cli_trace.add_parser(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "observe":
        return observe(args)
    if args.command == "replay":
        return cli_replay.main(args)
    if args.command == "trace":
        return cli_trace.main(args)
    return 2  # pragma: no cover - argparse enforces the subcommands
