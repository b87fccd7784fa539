"""The service's view of its own KV-event publisher: ``GET /api/kv-events``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.api.declare import route
from app.api.deps import ReadAuth
from app.pool.views.summary import KvEvents
from app.web.error_shape import ERROR_RESPONSES

router = APIRouter(prefix="/api", tags=["kv-events"], responses=ERROR_RESPONSES)


@route(router.get, "/kv-events", KvEvents, "The ZMQ KV-event publisher", ReadAuth)
async def kv_events(request: Request) -> KvEvents:
    """Endpoints, sequence numbers, the replay buffer and every counter --
    ``batches_dropped`` / ``events_dropped`` count batches the engine could
    not queue (their seqs are left as gaps subscribers see).  ``mode`` is
    what the PUB socket does with ``bound_endpoint``: ``"bind"`` (subscribers
    connect to it) or ``"connect"`` (a subscriber must bind that address;
    ``--kv-events-bind auto`` connects to a concrete address such as
    127.0.0.1); ``events_format`` is ``"v016"`` or ``"map"``.  ``fleet_url``:
    the page of the fleet observer following this stream (``--fleet-url``),
    or null."""
    fleet_url = request.app.state.settings.fleet_url
    publisher = getattr(request.app.state, "kv_publisher", None)
    if publisher is None:
        return KvEvents(enabled=False, fleet_url=fleet_url)
    status: dict[str, Any] = publisher.status()
    return KvEvents(**status, fleet_url=fleet_url)
