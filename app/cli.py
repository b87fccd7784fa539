"""``blockpool`` command line: ``blockpool serve`` starts the service,
``blockpool observe`` follows vLLM KV-event streams.

Flags override ``BLOCKPOOL_*`` environment settings, which override defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from app.core.settings import ObserverSettings, Settings
from app.trace import cli as cli_trace
from blockpool.core.free_order import FREE_ORDERS

S = TypeVar("S", bound=BaseSettings)

logger = logging.getLogger("blockpool")


def _bool_flag(p: argparse.ArgumentParser, name: str, dest: str, help_text: str) -> None:
    p.add_argument(f"--{name}", dest=dest, action="store_true", default=None, help=help_text)
    p.add_argument(f"--no-{name}", dest=dest, action="store_false", default=None)


TOKEN_FLAG_NOTE = "; every local user sees it in ps: prefer --token-file or BLOCKPOOL_TOKEN"


def _serving_flags(p: argparse.ArgumentParser) -> None:
    """The token file and the connection limits (app/core/serving.py), both apps."""
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


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="blockpool", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
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
    _bool_flag(s, "caching", "enable_caching", "prefix caching")
    s.add_argument(
        "--free-order", choices=FREE_ORDERS,
        help="where freed blocks enter the free queue: append_all (vLLM 0.16) or "
        "uncached_first (vLLM >= 0.24: blocks without a hash to the head)",
    )  # fmt: skip
    _bool_flag(s, "events", "enable_events", "KV events")
    s.add_argument("--metrics-sample-rate", type=float, help="residency sampling rate")
    s.add_argument("--model-name", help="the model_name label on /metrics (vLLM's served model)")
    _bool_flag(s, "storage", "storage", "torch K/V storage")
    s.add_argument("--device", dest="storage_device", help="storage device")
    s.add_argument("--host", help="bind address")
    s.add_argument("--port", type=int, help="port")
    s.add_argument("--token", help="bearer token required by mutating endpoints" + TOKEN_FLAG_NOTE)
    _serving_flags(s)
    s.add_argument(
        "--allowed-host", dest="allowed_hosts", action="append", metavar="NAME",
        help="a Host name browsers may use (repeatable; loopback names and IPs always work)",
    )  # fmt: skip
    s.add_argument(
        "--allowed-origin", dest="allowed_origins", action="append", metavar="ORIGIN",
        help="a page origin (scheme://host[:port]) that may send mutating requests (repeatable)",
    )  # fmt: skip
    _bool_flag(s, "demo", "demo", "run the demo workload")
    s.add_argument("--demo-rate", type=float, help="demo requests per second")
    cli_trace.add_serve_flags(s)
    s.add_argument("--tick-hz", type=float, help="stream ticks per second")
    s.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )  # fmt: skip
    _kv_event_flags(s)
    _bool_flag(s, "analysis", "analysis", "miss reasons, regret, shadow pools, recording")
    _mirror_flags(s)
    s.add_argument(
        "--shadow-mode", choices=["process", "inline", "off"], help="where shadow pools run"
    )
    with_defaults(s, Settings)
    _observe_parser(sub)
    r = sub.add_parser("replay", help="replay a recording (GET /api/history/export), check it")
    r.add_argument("path", help="the JSON-lines recording")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    cli_trace.add_parser(sub)
    return ap


# What a setting left at None means, for the help text.
NONE_MEANS = {
    "storage_device": "cuda when present, else cpu",
    "token": "no token",
    "kv_events_replay_endpoint": "no replay socket",
    "memory_budget_bytes": "the block count decides",
}


def help_default(settings_cls: type[BaseSettings], dest: str) -> str:
    """A setting's built-in default as the help shows it: on/off, none (and
    what that means), the number or the text ('' for empty)."""
    defaults = settings_cls.model_construct()  # the defaults, not the environment
    value = getattr(defaults, dest)
    if dest == "num_blocks" and value is None and isinstance(defaults, Settings):
        value = defaults.effective_num_blocks
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return f"none: {NONE_MEANS[dest]}" if dest in NONE_MEANS else "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "none"
    return str(value) if value != "" else "''"


def with_defaults(p: argparse.ArgumentParser, settings_cls: type[BaseSettings]) -> None:
    """Append ``(default: X)`` from the settings to every flag of ``p`` that
    sets one (generated, so the help cannot drift from the settings)."""
    fields = settings_cls.model_fields
    for action in p._actions:
        if action.dest in fields and action.option_strings and action.help:
            shown = help_default(settings_cls, action.dest).replace("%", "%%")
            if isinstance(action, argparse._StoreFalseAction):  # --no-X: say what X is
                shown = f"{action.dest.replace('_', ' ')} {shown}"
            action.help = f"{action.help} (default: {shown})"


def _kv_event_flags(s: argparse.ArgumentParser) -> None:
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


def _observe_parser(sub: Any) -> None:
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
        "does when its kv-events endpoint is a concrete host (tcp://this-host:5557)",
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
    o.add_argument("--host", help="bind address")
    o.add_argument("--port", type=int, help="port")
    o.add_argument("--token", help="bearer token required by every read" + TOKEN_FLAG_NOTE)
    _serving_flags(o)
    o.add_argument("--allowed-host", dest="allowed_hosts", action="append", metavar="NAME",
                   help="a Host name browsers may use (repeatable)")  # fmt: skip
    o.add_argument("--allowed-origin", dest="allowed_origins", action="append",
                   metavar="ORIGIN", help="a page origin that may POST (repeatable)")  # fmt: skip
    o.add_argument("--tick-hz", type=float, help="websocket updates per second")
    o.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )  # fmt: skip
    with_defaults(o, ObserverSettings)


def _mirror_flags(s: argparse.ArgumentParser) -> None:
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


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags give (those left out are None)."""
    skip = {"command", "log_level", "token_file", "mirror", "mirror_wait"}
    given = {k: v for k, v in vars(args).items() if k not in skip and v is not None}
    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        given["token"] = read_token_file(token_file)
    return given


class TokenFileError(ValueError):
    """The --token-file could not be read (exit 2)."""


def read_token_file(path: str) -> str:
    """The first line of ``path``, without its line ending."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline(65536)
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"--token-file {path}: {exc}") from None
    token = first.rstrip("\r\n")
    if not token.strip():
        raise TokenFileError(f"--token-file {path}: line 1 is empty (no token)")
    return token


def warn_token_flag(args: argparse.Namespace) -> None:
    if getattr(args, "token", None) is not None:
        logger.warning(
            "the token was given with --token: every local user can read it in the "
            "process list (ps, /proc); pass it with --token-file PATH or BLOCKPOOL_TOKEN"
        )


def settings_from(args: argparse.Namespace) -> Settings:
    given = _given(args)
    # an endpoint flag turns the publisher on unless --no-kv-events says otherwise
    if "kv_events_publisher" not in given and any(
        k in given for k in ("kv_events_endpoint", "kv_events_replay_endpoint")
    ):
        given["kv_events_publisher"] = True
    return Settings(**given)


def observer_settings_from(args: argparse.Namespace) -> ObserverSettings:
    return ObserverSettings(**_given(args))


def describe(settings: Settings, num_blocks: int) -> str:
    s = settings
    return (
        f"pool: {num_blocks} blocks x {s.block_size} tokens, {s.num_groups} group(s), "
        f"hash {s.hash_fn}, caching {'on' if s.enable_caching else 'off'}, "
        f"free order {s.free_order}, events "
        f"{'on' if s.enable_events else 'off'}, metrics sample rate {s.metrics_sample_rate}; "
        f"storage {'on' if s.storage else 'off'}; demo "
        f"{f'on at {s.demo_rate}/s' if s.demo else 'off'}; "
        f"auth {'token required for writes' if s.token else 'off'}"
    )


def _url_host(host: str) -> str:
    """The bind address as a URL writes it (an IPv6 one in brackets)."""
    return f"[{host}]" if ":" in host else host


def _run_server(
    app: Any, host: str, port: int, log_level: str, limits: Any, ws_max_size: int = 4096
) -> int:
    """Serve ``app`` with uvicorn until a signal stops it (``limits``: the
    settings' connection limits, app/core/serving.py)."""
    import uvicorn

    from app.core.auth import install_log_redaction
    from app.core.serving import uvicorn_config

    config = uvicorn_config(app, host, port, log_level, limits, ws_max_size)
    install_log_redaction(getattr(limits, "token", None))  # after Config (it configures logging)
    server = uvicorn.Server(config)
    # Ctrl-C comes back as KeyboardInterrupt after a graceful shutdown:
    # swallowed, as uvicorn.run does
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 3  # uvicorn.run's code for a failed start


def _settings_or_none(
    build: Callable[[argparse.Namespace], S], args: argparse.Namespace, prog: str
) -> S | None:
    """The settings from the flags, or None once it said why they are not."""
    try:
        return build(args)
    except ValidationError as exc:
        # each field and what is wrong, not the input (a URL may hold a secret)
        lines = [
            f"  {'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        ]
        print(f"{prog}: invalid settings:\n" + "\n".join(lines), file=sys.stderr)
    except TokenFileError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
    return None


def _start_logging(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    warn_token_flag(args)


def serve(args: argparse.Namespace) -> int:
    from app.main import create_app

    settings = _settings_or_none(settings_from, args, "blockpool")
    if settings is None:
        return 2
    _start_logging(args)
    mirror = getattr(args, "mirror", None)
    if mirror:
        from app.mirror import setup as mirror_setup

        try:
            mirror_setup.check_endpoint(mirror)
            logger.info("mirror: waiting for the engine's handshake on %s", mirror)
            hello = mirror_setup.wait_hello(mirror, args.mirror_wait)
        except mirror_setup.MirrorStartError as exc:
            print(f"blockpool: {exc}", file=sys.stderr)
            return 2
        settings = mirror_setup.settings_for(hello, settings)
    try:
        app = create_app(settings)
    except ValueError as exc:  # e.g. a K/V memory budget that holds no block
        print(f"blockpool: invalid settings: {exc}", file=sys.stderr)
        return 2
    engine = app.state.engine
    if mirror:
        mirror_setup.install(app, mirror, mirror_setup.control_for(mirror, hello))
        logger.info("mirror: read only, following %s", mirror)
    logger.info("%s", describe(app.state.settings, engine.pool.num_gpu_blocks))
    if engine.storage is not None:
        logger.info("storage: %s", engine.storage_facts())
    shown = _url_host(settings.host)
    logger.info(
        "dashboard: http://%s:%d/  API docs: http://%s:%d/docs",
        shown,
        settings.port,
        shown,
        settings.port,
    )
    return _run_server(
        app, settings.host, settings.port, args.log_level, settings, settings.ws_max_message_bytes
    )


def observe(args: argparse.Namespace) -> int:
    from app.observer.app import create_observer_app

    settings = _settings_or_none(observer_settings_from, args, "blockpool observe")
    if settings is None:
        return 2
    if not settings.endpoints and not settings.bind_endpoints:
        print("blockpool observe: give at least one ENDPOINT or --bind ENDPOINT", file=sys.stderr)
        return 2
    _start_logging(args)
    app = create_observer_app(settings)
    for spec in settings.sources():
        logger.info(
            "observing %s: %s %s%s (dp rank %d)",
            spec.name,
            "binding" if spec.bind else "connecting to",
            spec.endpoint,
            f", replay {spec.replay_endpoint}" if spec.replay_endpoint else ", no replay",
            spec.data_parallel_rank,
        )
    logger.info("fleet dashboard: http://%s:%d/", _url_host(settings.host), settings.port)
    return _run_server(app, settings.host, settings.port, args.log_level, settings)


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


if __name__ == "__main__":
    sys.exit(main())
