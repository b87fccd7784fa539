"""The flags of ``blockpool observe``: the KV-event streams it follows and
the fleet dashboard it serves."""

from __future__ import annotations

from typing import Any

from app.cli.flag_table import LOG_LEVEL, Flag, add_flags
from app.cli.help_defaults import with_defaults
from app.cli.serving_flags import serving_flags
from app.shared.settings import ObserverSettings

# the streams followed, before the flags both apps share
STREAM_FLAGS = (
    Flag(
        "endpoints",
        "[name=]tcp://host:port of a PUB socket (vLLM's kv-events-config endpoint)",
        nargs="*",
        metavar="ENDPOINT",
    ),
    Flag(
        "--bind",
        "[name=]tcp://host:port to bind (repeatable), for publishers that connect: vLLM "
        "does when its kv-events endpoint is a concrete host (tcp://this-host:5557). One "
        "publisher per address: the first connection to send, until it closes; another's "
        "messages are refused and counted (bind an address only the engines reach)",
        dest="bind_endpoints",
        action="append",
        metavar="ENDPOINT",
    ),
    Flag(
        "--max-hashes",
        "hashes held per pool at most (more are counted as overflow, not kept)",
        type=int,
    ),
    Flag(
        "--replay",
        "the replay (ROUTER) endpoint of each ENDPOINT, in order; 'none' for one without",
        dest="replay_endpoints",
        action="append",
        metavar="ENDPOINT",
    ),
    Flag(
        "--dashboard",
        "the dashboard of instance NAME (a blockpool serve --mirror of that engine; "
        "repeatable): its card on the fleet page links it",
        dest="dashboards",
        action="append",
        metavar="NAME=URL",
    ),
    Flag(
        "--max-message-bytes",
        "the byte cap on every message (live and replayed): a frame over it closes its "
        "connection before it is read (ZMQ_MAXMSGSIZE)",
        dest="max_batch_bytes",
        type=int,
        metavar="BYTES",
    ),
    Flag("--dp-size", "data-parallel ranks per endpoint: ports +0..N-1", type=int),
    Flag("--topic", "topic prefix to subscribe to ('' = all)"),
    Flag(
        "--no-bootstrap-replay",
        "do not ask for seq 0 on when joining mid-stream",
        dest="bootstrap_replay",
        action="store_false",
        default=None,
    ),
    Flag(
        "--replay-timeout",
        "seconds without a replay answer before giving up",
        dest="replay_timeout_s",
        type=float,
    ),
)


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
    add_flags(o, STREAM_FLAGS)
    add_flags(
        o,
        serving_flags(
            token_guards="every read",
            allowed_host="a Host name browsers may use (repeatable)",
            allowed_origin="a page origin that may POST (repeatable)",
        ),
    )
    add_flags(o, (Flag("--tick-hz", "websocket updates per second", type=float), LOG_LEVEL))
    with_defaults(o, ObserverSettings)
