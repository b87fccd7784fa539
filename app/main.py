"""The application factory: settings -> engine -> FastAPI app."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.analysis.recent import RecentAnalysis
from app.api import (
    routes_analysis,
    routes_demo,
    routes_inspect,
    routes_operator,
    routes_pool,
    routes_requests,
    routes_trace,
)
from app.api import routes_kvevents as kvevents_routes
from app.api.deps import require_read
from app.pool import storage_link
from app.pool.demo import DemoWorkload
from app.pool.engine import Engine
from app.pool.scrape import StatsSource, make_registry
from app.shared.auth import install_log_redaction
from app.shared.frontend_files import BESIDE, frontend_dir
from app.shared.settings import Settings
from app.stream import ws as stream_ws
from app.stream.hub import StreamHub
from app.trace.driver import TraceDriver
from app.web import assembly
from blockpool.trace import read_trace

logger = logging.getLogger("blockpool")
FRONTEND: Path = frontend_dir() or BESIDE


def build_storage(settings: Settings) -> Any:
    """Torch-backed K/V storage for the pool, or None when storage is off."""
    if not settings.storage:
        return None
    from app.pool.storage_link import make_storage

    return make_storage(settings)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    install_log_redaction(settings.token)  # whoever serves the app: no secret in a log line
    settings, storage_off = storage_link.settle(settings)
    if storage_off is not None:
        logger.warning("%s", storage_off)
    storage, num_blocks = None, settings.num_blocks
    if settings.storage:
        storage = build_storage(settings)
        if settings.memory_budget_bytes is not None:
            num_blocks = storage.num_blocks
            settings = settings.model_copy(
                update={"num_blocks": num_blocks, "memory_budget_bytes": None}
            )
    engine = Engine(settings, storage)
    demo = DemoWorkload(engine, rate=settings.demo_rate)
    trace_driver = TraceDriver(engine, settings.trace_speed, settings.trace_loop)
    if settings.trace is not None:  # a bad file: ValueError, "invalid settings"
        trace_driver.load(read_trace(settings.trace), Path(settings.trace).name)
    hub = StreamHub(engine)
    engine.waiting_sources.append(lambda: len(demo.waiting))  # vllm:num_requests_waiting
    engine.waiting_sources.append(lambda: len(trace_driver.waiting))
    recent = RecentAnalysis(engine)
    engine.listeners.append(recent.on_tick)
    extra: dict[str, StatsSource] = {"demo": demo.figures, "stream": hub.figures}
    extra["trace"] = trace_driver.figures
    extra["gc"] = engine.gc_pacer.figures
    if storage is not None:
        extra["storage"] = storage.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The engine's start freezes the pool's blocks (they live as long as
        # the server) and from then on paces the collections
        # (app/pool/gc_pacer.py); a service rebuilt in this process (a
        # mirror's engine restarted as another pool) had the last one's
        # garbage collected first (app/cli/forget_app.py).
        await engine.start()
        for hook in app.state.startup_hooks:
            await hook()
        if settings.trace is not None:
            trace_driver.start()  # the trace instead of the demo
        elif settings.demo:
            demo.start()
        try:
            yield
        finally:
            await trace_driver.stop(finish_running=False)
            await demo.stop(finish_running=False)
            for hook in reversed(app.state.shutdown_hooks):
                await hook()
            await engine.stop()

    app = assembly.new_app(
        "blockpool",
        "vLLM's paged KV-cache block pool, observable and driveable over REST",
        lifespan,
    )
    app.state.settings = settings
    app.state.storage_off = storage_off
    app.state.engine = engine
    app.state.demo = demo
    app.state.trace_driver = trace_driver
    app.state.stream = hub
    app.state.analysis_recent = recent
    app.state.metrics_sources = extra
    app.state.startup_hooks = []
    app.state.shutdown_hooks = []
    if settings.kv_events_publisher:
        _add_kv_event_publisher(app, engine, settings)
    registry, app.state.metrics_collector = make_registry(engine, extra)

    app.include_router(routes_pool.router)
    app.include_router(routes_inspect.router)
    app.include_router(routes_requests.router)
    app.include_router(routes_demo.router)
    app.include_router(routes_trace.router)
    app.include_router(routes_analysis.router)
    app.include_router(routes_operator.router)
    app.include_router(stream_ws.router)
    app.include_router(kvevents_routes.router)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        require_read(request)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    assembly.serve_page(app, FRONTEND, "index.html")
    assembly.limit_bodies(app, settings.max_body_bytes)
    assembly.guard(app, settings.host, settings.allowed_hosts, settings.allowed_origins)
    return app


def _add_kv_event_publisher(app: FastAPI, engine: Engine, settings: Settings) -> None:
    """Publish the engine's KV events over ZMQ as vLLM does (started and
    stopped with the app; its counters under ``blockpool_kvevents_*``)."""
    from blockpool.common.figures import Figures
    from blockpool.kvevents.publisher import KVEventPublisher
    from blockpool.kvevents.publisher_counts import PUBLISHER_HELP

    publisher = KVEventPublisher(settings.kv_events_config())
    app.state.kv_publisher = publisher

    async def start() -> None:
        publisher.start()
        publisher.attach(engine)  # start() logged "KV events: PUB bind|connect <endpoint>"

    async def stop() -> None:
        publisher.detach()
        await asyncio.to_thread(publisher.stop)  # sends what is queued, up to 1 s

    app.state.startup_hooks.append(start)
    app.state.shutdown_hooks.append(stop)
    app.state.metrics_sources["kvevents"] = Figures(publisher.metrics, PUBLISHER_HELP)
