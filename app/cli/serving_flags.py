"""The flags both apps share: where they listen, the bearer token (and its
file), the connection limits (app/shared/serving.py) and the Host names and
page origins browsers may use."""

from __future__ import annotations

from app.cli.flag_table import Flag

TOKEN_FLAG_NOTE = "; every local user sees it in ps: prefer --token-file or BLOCKPOOL_TOKEN"


def serving_flags(*, token_guards: str, allowed_host: str, allowed_origin: str) -> tuple[Flag, ...]:
    """Both apps' flags, in this order: ``--host``, ``--port``, ``--token``
    (``token_guards``: what it guards), the token file and the connection
    limits, ``--allowed-host`` and ``--allowed-origin`` (their helps: each
    app's own words)."""
    return (
        Flag("--host", "bind address"),
        Flag("--port", "port", type=int),
        Flag("--token", f"bearer token required by {token_guards}" + TOKEN_FLAG_NOTE),
        Flag(
            "--token-file",
            "read the bearer token from this file (its first line); the way to pass it",
            metavar="PATH",
        ),
        Flag(
            "--forwarded-allow-ips",
            "proxies (comma-separated, '*': any) whose X-Forwarded-For is trusted",
            metavar="IPS",
        ),
        Flag(
            "--header-timeout",
            "seconds a connection has to send a request's headers (then 408)",
            dest="header_timeout_s",
            type=float,
        ),
        Flag(
            "--body-timeout",
            "seconds a request has to send its whole body (then 408)",
            dest="body_timeout_s",
            type=float,
        ),
        Flag(
            "--keep-alive", "seconds an idle connection is kept open", dest="keep_alive_s", type=int
        ),
        Flag("--max-connections", "connections open at once (beyond: 503)", type=int),
        Flag("--allowed-host", allowed_host, dest="allowed_hosts", action="append", metavar="NAME"),
        Flag(
            "--allowed-origin",
            allowed_origin,
            dest="allowed_origins",
            action="append",
            metavar="ORIGIN",
        ),
    )
