"""The flags both apps share: where they listen, the bearer token (and its
file), the connection limits (app/shared/serving.py) and the Host names and
page origins browsers may use."""

from __future__ import annotations

import argparse

TOKEN_FLAG_NOTE = "; every local user sees it in ps: prefer --token-file or BLOCKPOOL_TOKEN"


def add_serving_flags(
    p: argparse.ArgumentParser, *, token_guards: str, allowed_host: str, allowed_origin: str
) -> None:
    """Both apps' flags, in this order: ``--host``, ``--port``, ``--token``
    (``token_guards``: what it guards), the token file and the connection
    limits, ``--allowed-host`` and ``--allowed-origin`` (their helps: each
    app's own words)."""
    p.add_argument("--host", help="bind address")
    p.add_argument("--port", type=int, help="port")
    p.add_argument("--token", help=f"bearer token required by {token_guards}" + TOKEN_FLAG_NOTE)
    p.add_argument(
        "--token-file", metavar="PATH",
        help="read the bearer token from this file (its first line); the way to pass it",
    )  # fmt: skip
    p.add_argument(
        "--forwarded-allow-ips", metavar="IPS",
        help="proxies (comma-separated, '*': any) whose X-Forwarded-For is trusted",
    )  # fmt: skip
    p.add_argument(
        "--header-timeout", dest="header_timeout_s", type=float,
        help="seconds a connection has to send a request's headers (then 408)",
    )  # fmt: skip
    p.add_argument(
        "--body-timeout", dest="body_timeout_s", type=float,
        help="seconds a request has to send its whole body (then 408)",
    )  # fmt: skip
    p.add_argument(
        "--keep-alive", dest="keep_alive_s", type=int,
        help="seconds an idle connection is kept open",
    )  # fmt: skip
    p.add_argument("--max-connections", type=int, help="connections open at once (beyond: 503)")
    p.add_argument(
        "--allowed-host", dest="allowed_hosts", action="append", metavar="NAME", help=allowed_host
    )
    p.add_argument(
        "--allowed-origin", dest="allowed_origins", action="append", metavar="ORIGIN",
        help=allowed_origin,
    )  # fmt: skip
