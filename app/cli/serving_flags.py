"""The flags both apps share: the token file and the connection limits
(app/shared/serving.py)."""

from __future__ import annotations

import argparse

TOKEN_FLAG_NOTE = "; every local user sees it in ps: prefer --token-file or BLOCKPOOL_TOKEN"


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    """The token file and the connection limits (app/shared/serving.py), both apps."""
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
