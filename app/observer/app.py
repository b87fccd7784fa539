"""``blockpool observe``: a dashboard of real vLLM (or SGLang, or blockpool)
instances, rebuilt from their ZMQ KV-event streams alone.

REST (JSON; hashes as hex strings -- 16 digits for the 64-bit int form):

* ``GET /api/health``
* ``GET /api/fleet`` -- every pool's stream health and map summary
* ``GET /api/fleet/prefixes`` -- prefix families and who holds them; with
  ``hash=`` (one block: its whole prefix; several, comma-separated: a
  request's hashes in order) or ``tokens=``: each pool's leading blocks
  (also ``POST`` with a JSON body for long prompts)
* ``GET /api/fleet/{instance}/hashmap`` -- paged, searchable by hash prefix
* ``GET /api/fleet/{instance}/prefix-tree``
* ``GET /api/fleet/{instance}/events?since=`` -- the pool's event log
* ``WS  /api/fleet/stream`` -- one JSON message per tick (see docs/observer.md)
* ``GET /metrics`` -- Prometheus, per-pool stream health (label ``pool``)

With a token every route but ``/api/health`` and the page needs
``Authorization: Bearer <token>`` (the websocket and the page may pass
``?token=``), checked before any request body is read (``bearer.TokenGate``);
bodies over ``max_body_bytes`` are refused with 413 unread.

Here: the app (``create_observer_app``), the websocket and the page.  The
REST routes are ``routes.py``, ``/metrics`` ``metrics.py``,
the token check ``bearer.py``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, WebSocket
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from app.observer.bearer import Auth, TokenGate
from app.observer.fleet import Fleet
from app.observer.hub import FleetHub
from app.observer.metrics import ObserverCollector
from app.observer.routes import router
from app.observer.source import Source
from app.shared.frontend_files import BESIDE, frontend_dir
from app.shared.settings import ObserverSettings
from app.web import assembly, ws_endpoint

logger = logging.getLogger("blockpool.observer")
FRONTEND: Path = frontend_dir() or BESIDE


def create_observer_app(settings: ObserverSettings | None = None) -> FastAPI:
    settings = settings or ObserverSettings()
    links = settings.dashboard_urls()  # each engine's own dashboard (--dashboard)
    sources = [
        Source(
            spec,
            topic=settings.topic,
            event_log_capacity=settings.event_log_capacity,
            replay_timeout=settings.replay_timeout_s,
            replay_backoff=settings.replay_backoff_s,
            bootstrap_replay=settings.bootstrap_replay,
            max_pending=settings.max_pending,
            rcvhwm=settings.rcvhwm,
            max_batch_bytes=settings.max_batch_bytes,
            silence_s=settings.silence_s,
            max_hashes=settings.max_hashes,
            max_batch_hashes=settings.max_batch_hashes,
            max_batch_events=settings.max_batch_events,
            max_batch_tokens=settings.max_batch_tokens,
            dashboard_url=links.get(spec.name),
        )
        for spec in settings.sources()
    ]
    fleet = Fleet(sources)
    hub = FleetHub(fleet, settings.tick_hz, settings.ws_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:  # noqa: ARG001 FastAPI's lifespan signature
        await fleet.start()
        await hub.start()
        try:
            yield
        finally:
            await hub.stop()
            await fleet.stop()

    app = assembly.new_app(
        "blockpool observer",
        "A fleet of vLLM prefix caches, rebuilt from their ZMQ KV-event streams",
        lifespan,
        settings=settings,
        fleet=fleet,
        hub=hub,
    )
    app.include_router(router)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ObserverCollector(fleet, hub))

    @app.get("/metrics", include_in_schema=False, dependencies=[Auth])
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.websocket("/api/fleet/stream")
    async def stream(ws: WebSocket) -> None:
        # the token as the stream takes it: the Authorization header, the
        # Sec-WebSocket-Protocol header (bearer.* / base64url.bearer.*, what
        # the fleet page sends: no secret in the URL) or ?token= (discouraged)
        allowed = ws_endpoint.authorized(ws, settings.token)
        if await ws_endpoint.accept(ws, allowed, "unauthorized"):
            # what the page sends is read (bounded) and ignored
            await ws_endpoint.serve(ws, hub.fan, hub.add())

    assembly.serve_page(app, FRONTEND, "fleet.html")
    # outermost first: the same-origin guard, then the token, then the body's
    # size -- a stranger's body is never read, a client's is bounded
    assembly.limit_bodies(app, settings.max_body_bytes)
    app.add_middleware(TokenGate, token=settings.token)
    assembly.guard(app, settings.host, settings.allowed_hosts, settings.allowed_origins)
    return app
