"""The ``serve`` and ``observe`` commands: settings, logging, the app, the
server."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from app.cli.server import StopRequest, run_server, url_host
from app.cli.settings import observer_settings_from, settings_from, settings_or_none
from app.shared.settings import Settings

logger = logging.getLogger("blockpool")


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


def warn_token_flag(args: argparse.Namespace) -> None:
    if getattr(args, "token", None) is not None:
        logger.warning(
            "the token was given with --token: every local user can read it in the "
            "process list (ps, /proc); pass it with --token-file PATH or BLOCKPOOL_TOKEN"
        )


def start_logging(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    warn_token_flag(args)


def serve(args: argparse.Namespace) -> int:
    from app.main import create_app

    settings = settings_or_none(settings_from, args, "blockpool")
    if settings is None:
        return 2
    start_logging(args)
    mirror = getattr(args, "mirror", None)
    if mirror:
        return serve_mirror(args, settings, mirror)
    try:
        app = create_app(settings)
    except ValueError as exc:  # e.g. a K/V memory budget that holds no block
        print(f"blockpool: invalid settings: {exc}", file=sys.stderr)
        return 2
    return _serve_app(app, args)


def serve_mirror(args: argparse.Namespace, given: Settings, mirror: str) -> int:
    """``serve --mirror``: the service sized as the engine's pool, built
    again from the engine's new handshake whenever the engine restarts as
    another pool (same process, same port; app/mirror/setup.py)."""
    from app.cli.forget_app import forget_served_app
    from app.main import create_app
    from app.mirror import setup as mirror_setup

    try:
        mirror_setup.check_endpoint(mirror)
        key = mirror_setup.read_key(given.mirror_token_file)
        if key is None:
            logger.warning(
                "mirror: no --mirror-token-file: whoever reaches %s can read the stream "
                "and speak as the engine (README: Watch your vLLM)",
                mirror,
            )
        logger.info("mirror: waiting for the engine's handshake on %s", mirror)
        hello = mirror_setup.wait_hello(mirror, args.mirror_wait, key)
    except mirror_setup.MirrorStartError as exc:
        print(f"blockpool: {exc}", file=sys.stderr)
        return 2
    rebuilds = 0
    while True:
        settings = mirror_setup.settings_for(hello, given)
        try:
            app = create_app(settings)
        except ValueError as exc:  # an engine's pool the service cannot be built as
            print(f"blockpool: invalid settings: {exc}", file=sys.stderr)
            return 2
        stop = StopRequest()
        control = mirror_setup.control_for(mirror, hello)
        client = mirror_setup.install(
            app, mirror, control, key, hello, rebuild=_stopping(stop), rebuilds=rebuilds
        )
        logger.info("mirror: read only, following %s", mirror)
        built = time.monotonic()
        code = _serve_app(app, args, stop)
        new = client.service_rebuild.rebuild_for
        if not stop.honoured or new is None:  # a signal, or a failed start
            return code
        del app, client
        forget_served_app()  # the last service's pool freed before the next one's
        rebuilds += 1
        logger.info(
            "mirror: the engine restarted as %d blocks of %d tokens (was %d): "
            "rebuilding the service",
            new.num_gpu_blocks,
            new.block_size,
            hello.num_gpu_blocks,
        )
        hello = new
        wait = built + mirror_setup.REBUILD_MIN_S - time.monotonic()
        if wait > 0:  # an engine restarting again and again: one rebuild per REBUILD_MIN_S
            logger.info(
                "mirror: rebuilding in %.1f s (one rebuild at most per %g s)",
                wait,
                mirror_setup.REBUILD_MIN_S,
            )
            try:
                time.sleep(wait)
            except KeyboardInterrupt:
                return 0


def _stopping(stop: StopRequest) -> Callable[[Any], None]:
    """The mirror's ``rebuild``: the server stopped in order (the client
    keeps the handshake, ``service_rebuild.rebuild_for``)."""
    return lambda _hello: stop.request()


def _serve_app(app: Any, args: argparse.Namespace, stop: StopRequest | None = None) -> int:
    """The app served until a signal (or ``stop``), its pool and URLs logged."""
    settings = app.state.settings
    engine = app.state.engine
    logger.info("%s", describe(settings, engine.pool.num_gpu_blocks))
    if engine.storage is not None:
        logger.info("storage: %s", engine.storage_facts())
    shown = url_host(settings.host)
    logger.info(
        "dashboard: http://%s:%d/  API docs: http://%s:%d/docs",
        shown,
        settings.port,
        shown,
        settings.port,
    )
    return run_server(
        app,
        settings.host,
        settings.port,
        args.log_level,
        settings,
        settings.ws_max_message_bytes,
        stop,
    )


def observe(args: argparse.Namespace) -> int:
    from app.observer.app import create_observer_app

    settings = settings_or_none(observer_settings_from, args, "blockpool observe")
    if settings is None:
        return 2
    if not settings.endpoints and not settings.bind_endpoints:
        print("blockpool observe: give at least one ENDPOINT or --bind ENDPOINT", file=sys.stderr)
        return 2
    start_logging(args)
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
    logger.info("fleet dashboard: http://%s:%d/", url_host(settings.host), settings.port)
    return run_server(app, settings.host, settings.port, args.log_level, settings)
