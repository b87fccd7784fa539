"""The flags of ``blockpool serve``: the pool, the service, the KV-event
stream and the mirror."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli import trace as cli_trace
from app.cli.help_defaults import with_defaults
from app.cli.serving_flags import add_serving_flags
from app.shared.settings import Settings
from blockpool.core.free_order import FREE_ORDERS


def add_bool_flag(p: argparse.ArgumentParser, name: str, dest: str, help_text: str) -> None:
    p.add_argument(f"--{name}", dest=dest, action="store_true", default=None, help=help_text)
    p.add_argument(f"--no-{name}", dest=dest, action="store_false", default=None)


def add_serve_parser(sub: Any) -> None:
    s = sub.add_parser("serve", help="run the service (REST, stream, dashboard, /metrics)")
    size = s.add_mutually_exclusive_group()
    size.add_argument("--num-blocks", type=int, help="blocks in the pool, the null block included")
    size.add_argument(
        "--memory-budget", dest="memory_budget_bytes", type=int,
        help="derive the block count from this K/V byte budget (needs storage)",
    )  # fmt: skip
    s.add_argument("--block-size", type=int, help="tokens per block")
    s.add_argument("--num-groups", type=int, help="KV-cache groups")
    s.add_argument(
        "--hash-fn", choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
        help="block hash function",
    )  # fmt: skip
    add_bool_flag(s, "caching", "enable_caching", "prefix caching")
    s.add_argument(
        "--free-order", choices=FREE_ORDERS,
        help="where freed blocks enter the free queue: append_all (vLLM 0.16) or "
        "uncached_first (vLLM >= 0.24: blocks without a hash to the head)",
    )  # fmt: skip
    add_bool_flag(s, "events", "enable_events", "KV events")
    s.add_argument("--metrics-sample-rate", type=float, help="residency sampling rate")
    s.add_argument("--model-name", help="the model_name label on /metrics (vLLM's served model)")
    add_bool_flag(s, "storage", "storage", "torch K/V storage")
    s.add_argument("--device", dest="storage_device", help="storage device")
    add_serving_flags(
        s,
        token_guards="mutating endpoints",
        allowed_host="a Host name browsers may use (repeatable; loopback names and IPs "
        "always work)",
        allowed_origin="a page origin (scheme://host[:port]) that may send mutating requests "
        "(repeatable)",
    )
    add_bool_flag(s, "demo", "demo", "run the demo workload")
    s.add_argument("--demo-rate", type=float, help="demo requests per second")
    cli_trace.add_serve_flags(s)
    s.add_argument("--tick-hz", type=float, help="stream ticks per second")
    s.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )  # fmt: skip
    add_kv_event_flags(s)
    add_bool_flag(s, "analysis", "analysis", "miss reasons, regret, shadow pools, recording")
    add_mirror_flags(s)
    s.add_argument(
        "--shadow-mode", choices=["process", "inline", "off"], help="where shadow pools run"
    )
    with_defaults(s, Settings)


def add_kv_event_flags(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group(
        "KV-event stream (vLLM's ZMQ publisher; giving an endpoint turns it on)"
    )
    g.add_argument(
        "--kv-events", dest="kv_events_publisher", action="store_true", default=None,
        help="publish KV events over ZMQ as vLLM 0.16 does",
    )  # fmt: skip
    g.add_argument("--no-kv-events", dest="kv_events_publisher", action="store_false")
    g.add_argument("--kv-events-endpoint", help="PUB endpoint")
    g.add_argument("--kv-events-replay-endpoint", help="ROUTER replay endpoint")
    g.add_argument("--kv-events-topic", help="topic frame")
    g.add_argument("--kv-events-buffer-steps", type=int, help="batches kept for replay")
    g.add_argument("--kv-events-hwm", type=int, help="ZMQ high-water mark")
    g.add_argument("--kv-events-max-queue-size", type=int, help="batches queued")
    g.add_argument(
        "--kv-events-data-parallel-rank", type=int, help="DP rank: both ports move up by it"
    )
    g.add_argument(
        "--kv-events-bind", choices=["auto", "bind", "connect"],
        help="auto: bind wildcard/ipc addresses, connect to others (vLLM's rule)",
    )  # fmt: skip
    g.add_argument(
        "--kv-events-format", choices=["v016", "map"],
        help="v016: vLLM 0.16's positional events (default); map: the current vLLM's "
        "map-tagged events with group_idx and kv_cache_spec_kind",
    )  # fmt: skip
    g.add_argument(
        "--fleet-url", metavar="URL",
        help="the page of a blockpool observe following this server's KV events: the "
        "dashboard's 'fleet' link opens it (without it there is no link)",
    )  # fmt: skip


def add_mirror_flags(s: argparse.ArgumentParser) -> None:
    m = s.add_argument_group("mirror a vLLM engine (read only; README: Watch your vLLM)")
    m.add_argument(
        "--mirror", metavar="ENDPOINT",
        help="follow the pool of the vLLM engine publishing on this tcp://HOST:PORT "
        "(its BLOCKPOOL_MIRROR_ENDPOINT); the pool is sized as the engine's",
    )  # fmt: skip
    m.add_argument(
        "--mirror-wait", type=float, default=120.0, metavar="SECONDS",
        help="how long to wait for the engine's handshake (default: %(default)s)",
    )  # fmt: skip
    m.add_argument(
        "--mirror-token-file", metavar="PATH",
        help="the secret shared with the engine (its first line; the plugin's "
        "BLOCKPOOL_MIRROR_TOKEN_FILE): unsigned messages are refused",
    )  # fmt: skip
    m.add_argument(
        "--mirror-max-lag", dest="mirror_max_lag_s", type=float, metavar="SECONDS",
        help="past this lag the mirror says 'behind', not exact",
    )  # fmt: skip
    m.add_argument(
        "--mirror-max-backlog", type=int, metavar="MESSAGES",
        help="messages waiting at most; past it they are dropped for a fresh snapshot",
    )  # fmt: skip
