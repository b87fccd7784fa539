"""The flags of ``blockpool observe``: the KV-event streams it follows and
the fleet dashboard it serves."""

from __future__ import annotations

from typing import Any

from app.cli.help_defaults import with_defaults
from app.cli.serving_flags import add_serving_flags
from app.shared.settings import ObserverSettings


def add_observe_parser(sub: Any) -> None:
    o = sub.add_parser(
        "observe",
        help="follow vLLM/SGLang KV-event streams and serve a fleet dashboard",
        description=(
            "Subscribe to the ZMQ KV-event streams of one or more vLLM (or SGLang, or "
            "blockpool) instances and serve a dashboard of their prefix caches, rebuilt "
            "from the events alone."
        ),
    )
    o.add_argument(
        "endpoints", nargs="*", metavar="ENDPOINT",
        help="[name=]tcp://host:port of a PUB socket (vLLM's kv-events-config endpoint)",
    )  # fmt: skip
    o.add_argument(
        "--bind", dest="bind_endpoints", action="append", metavar="ENDPOINT",
        help="[name=]tcp://host:port to bind (repeatable), for publishers that connect: vLLM "
        "does when its kv-events endpoint is a concrete host (tcp://this-host:5557). One "
        "publisher per address: the first connection to send, until it closes; another's "
        "messages are refused and counted (bind an address only the engines reach)",
    )  # fmt: skip
    o.add_argument(
        "--max-hashes", type=int,
        help="hashes held per pool at most (more are counted as overflow, not kept)",
    )  # fmt: skip
    o.add_argument(
        "--replay", dest="replay_endpoints", action="append", metavar="ENDPOINT",
        help="the replay (ROUTER) endpoint of each ENDPOINT, in order; 'none' for one without",
    )  # fmt: skip
    o.add_argument(
        "--dashboard", dest="dashboards", action="append", metavar="NAME=URL",
        help="the dashboard of instance NAME (a blockpool serve --mirror of that engine; "
        "repeatable): its card on the fleet page links it",
    )  # fmt: skip
    o.add_argument(
        "--max-message-bytes", dest="max_batch_bytes", type=int, metavar="BYTES",
        help="the byte cap on every message (live and replayed): a frame over it closes its "
        "connection before it is read (ZMQ_MAXMSGSIZE)",
    )  # fmt: skip
    o.add_argument("--dp-size", type=int, help="data-parallel ranks per endpoint: ports +0..N-1")
    o.add_argument("--topic", help="topic prefix to subscribe to ('' = all)")
    o.add_argument(
        "--no-bootstrap-replay", dest="bootstrap_replay", action="store_false", default=None,
        help="do not ask for seq 0 on when joining mid-stream",
    )  # fmt: skip
    o.add_argument(
        "--replay-timeout", dest="replay_timeout_s", type=float,
        help="seconds without a replay answer before giving up",
    )  # fmt: skip
    add_serving_flags(
        o,
        token_guards="every read",
        allowed_host="a Host name browsers may use (repeatable)",
        allowed_origin="a page origin that may POST (repeatable)",
    )
    o.add_argument("--tick-hz", type=float, help="websocket updates per second")
    o.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )  # fmt: skip
    with_defaults(o, ObserverSettings)
