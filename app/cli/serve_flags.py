"""The flags of ``blockpool serve``: the pool, the service, the KV-event
stream and the mirror."""

from __future__ import annotations

from typing import Any

from app.cli import trace as cli_trace
from app.cli.flag_table import LOG_LEVEL, Flag, add_flags, switch
from app.cli.help_defaults import with_defaults
from app.cli.serving_flags import serving_flags
from app.shared.settings import Settings
from blockpool.core.free_order import FREE_ORDERS

# the pool's size: one of the two
SIZE_FLAGS = (
    Flag("--num-blocks", "blocks in the pool, the null block included", type=int),
    Flag(
        "--memory-budget",
        "derive the block count from this K/V byte budget (needs storage)",
        dest="memory_budget_bytes",
        type=int,
    ),
)

POOL_FLAGS = (
    Flag("--block-size", "tokens per block", type=int),
    Flag("--num-groups", "KV-cache groups", type=int),
    Flag(
        "--hash-fn",
        "block hash function",
        choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
    ),
    *switch("caching", "enable_caching", "prefix caching"),
    Flag(
        "--free-order",
        "where freed blocks enter the free queue: append_all (vLLM 0.16) or "
        "uncached_first (vLLM >= 0.24: blocks without a hash to the head)",
        choices=FREE_ORDERS,
    ),
    *switch("events", "enable_events", "KV events"),
    Flag("--metrics-sample-rate", "residency sampling rate", type=float),
    Flag("--model-name", "the model_name label on /metrics (vLLM's served model)"),
    *switch("storage", "storage", "torch K/V storage"),
    Flag("--device", "storage device", dest="storage_device"),
)

SERVING_FLAGS = serving_flags(
    token_guards="mutating endpoints",
    allowed_host="a Host name browsers may use (repeatable; loopback names and IPs always work)",
    allowed_origin="a page origin (scheme://host[:port]) that may send mutating requests "
    "(repeatable)",
)

DEMO_FLAGS = (
    *switch("demo", "demo", "run the demo workload"),
    Flag("--demo-rate", "demo requests per second", type=float),
)

KV_EVENTS_TITLE = "KV-event stream (vLLM's ZMQ publisher; giving an endpoint turns it on)"
KV_EVENT_FLAGS = (
    Flag(
        "--kv-events",
        "publish KV events over ZMQ as vLLM 0.16 does",
        dest="kv_events_publisher",
        action="store_true",
        default=None,
    ),
    Flag("--no-kv-events", dest="kv_events_publisher", action="store_false"),
    Flag("--kv-events-endpoint", "PUB endpoint"),
    Flag("--kv-events-replay-endpoint", "ROUTER replay endpoint"),
    Flag("--kv-events-topic", "topic frame"),
    Flag("--kv-events-buffer-steps", "batches kept for replay", type=int),
    Flag("--kv-events-hwm", "ZMQ high-water mark", type=int),
    Flag("--kv-events-max-queue-size", "batches queued", type=int),
    Flag("--kv-events-data-parallel-rank", "DP rank: both ports move up by it", type=int),
    Flag(
        "--kv-events-bind",
        "auto: bind wildcard/ipc addresses, connect to others (vLLM's rule)",
        choices=["auto", "bind", "connect"],
    ),
    Flag(
        "--kv-events-format",
        "v016: vLLM 0.16's positional events (default); map: the current vLLM's "
        "map-tagged events with group_idx and kv_cache_spec_kind",
        choices=["v016", "map"],
    ),
    Flag(
        "--fleet-url",
        "the page of a blockpool observe following this server's KV events: the "
        "dashboard's 'fleet' link opens it (without it there is no link)",
        metavar="URL",
    ),
)

MIRROR_TITLE = "mirror a vLLM engine (read only; README: Watch your vLLM)"
MIRROR_FLAGS = (
    Flag(
        "--mirror",
        "follow the pool of the vLLM engine publishing on this tcp://HOST:PORT "
        "(its BLOCKPOOL_MIRROR_ENDPOINT); the pool is sized as the engine's",
        metavar="ENDPOINT",
    ),
    Flag(
        "--mirror-wait",
        "how long to wait for the engine's handshake (default: %(default)s)",
        type=float,
        default=120.0,
        metavar="SECONDS",
    ),
    Flag(
        "--mirror-token-file",
        "the secret shared with the engine (its first line; the plugin's "
        "BLOCKPOOL_MIRROR_TOKEN_FILE): unsigned messages are refused",
        metavar="PATH",
    ),
    Flag(
        "--mirror-max-lag",
        "past this lag the mirror says 'behind', not exact",
        dest="mirror_max_lag_s",
        type=float,
        metavar="SECONDS",
    ),
    Flag(
        "--mirror-max-backlog",
        "messages waiting at most; past it they are dropped for a fresh snapshot",
        type=int,
        metavar="MESSAGES",
    ),
)


def add_serve_parser(sub: Any) -> None:
    s = sub.add_parser("serve", help="run the service (REST, stream, dashboard, /metrics)")
    add_flags(s.add_mutually_exclusive_group(), SIZE_FLAGS)
    add_flags(s, POOL_FLAGS + SERVING_FLAGS + DEMO_FLAGS)
    cli_trace.add_serve_flags(s)
    add_flags(s, (Flag("--tick-hz", "stream ticks per second", type=float), LOG_LEVEL))
    add_flags(s.add_argument_group(KV_EVENTS_TITLE), KV_EVENT_FLAGS)
    add_flags(s, switch("analysis", "analysis", "miss reasons, regret, shadow pools, recording"))
    add_flags(s.add_argument_group(MIRROR_TITLE), MIRROR_FLAGS)
    add_flags(
        s,
        (Flag("--shadow-mode", "where shadow pools run", choices=["process", "inline", "off"]),),
    )
    with_defaults(s, Settings)
