"""``GET /api/mirror``: is the dashboard's pool the engine's, exactly?
``GET /api/mirror/trace``: the engine's traffic as a trace the planner reads."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse

from app.api.costly import CostlyExport, CostlyRead, charged_lines
from app.api.deps import ReadAuth
from app.api.routes_analysis import NDJSONResponse, accepts_gzip, gzip_stream
from app.mirror.client import MirrorClient
from app.shared.errors import NotFound
from app.web.error_shape import ERROR_RESPONSES
from blockpool.mirror.digest import pool_digest
from blockpool.mirror.traffic import MAX_REQUESTS, engine_facts, traffic_lines

MAX_WINDOW_S = 366 * 86400.0

router = APIRouter(prefix="/api", tags=["mirror"], responses=ERROR_RESPONSES)


def _client(request: Request) -> MirrorClient:
    client: MirrorClient | None = getattr(request.app.state, "mirror", None)
    if client is None:
        raise NotFound("this service mirrors no engine (blockpool serve --mirror ENDPOINT)")
    return client


@router.get("/mirror", dependencies=[ReadAuth], summary="The mirror's state")
async def mirror(request: Request) -> dict[str, Any]:
    """connected, exact, divergences, resyncs, gaps, ops_applied, lag_ms and
    the engine's handshake (``engine``)."""
    status: dict[str, Any] = _client(request).status.as_dict()
    return status


@router.get("/mirror/requests", dependencies=[ReadAuth], summary="The engine's recent requests")
async def mirror_requests(
    request: Request, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> dict[str, Any]:
    """Newest first: arrival, prompt length, prefix hit, preemptions, finish."""
    book = _client(request).book
    return {"requests": book.recent(limit), "known": len(book.requests)}


@router.get("/mirror/requests/{request_id}", dependencies=[ReadAuth], summary="One engine request")
async def mirror_request(
    request: Request, request_id: Annotated[str, Path(min_length=1, max_length=200)]
) -> dict[str, Any]:
    """Its story as the engine told it, with its block hashes (64-bit cut)."""
    r = _client(request).book.requests.get(request_id)
    if r is None:
        raise NotFound(f"no request {request_id!r} heard of", request_id=request_id)
    return dict(r)


@router.get("/mirror/digest", dependencies=[CostlyRead], summary="The mirrored pool's digest")
async def mirror_digest(request: Request) -> dict[str, Any]:
    """The digest the engine's plugin computes of its pool (ref counts, hashes,
    queue order, the hash map), of the mirror's pool now, after ``ops``
    operations of the engine's: equal digests at equal ``ops``, equal pools."""
    client = _client(request)
    return {"ops": client.applier.next_op, "digest": pool_digest(request.app.state.engine.pool)}


@router.get(
    "/mirror/trace",
    dependencies=[CostlyExport],
    summary="The engine's traffic as a trace (blockpool trace reads it)",
    response_class=NDJSONResponse,
    responses={200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}}}},
)
async def mirror_trace(
    request: Request,
    window_s: Annotated[
        float | None,
        Query(
            gt=0, le=MAX_WINDOW_S, description="only requests that arrived this long ago or since"
        ),
    ] = None,
    limit: Annotated[
        int | None, Query(ge=1, le=MAX_REQUESTS, description="the newest this many requests")
    ] = None,
) -> StreamingResponse:
    """The engine's finished requests in arrival order as JSON lines: a
    ``blockpool-mirror-trace`` header (the engine's facts, ``tokens_per_id``:
    its block size), then one Mooncake row a request -- arrival (ms),
    prompt length, output length, one hash id per prompt block (the same id
    for the same block hash), the engine's prefix hit.  No token ids.
    ``blockpool trace FILE --block-size N --free-order ORDER`` replays it.
    Gzip-compressed when ``Accept-Encoding`` allows it."""
    client = _client(request)
    hello = client.service_rebuild.built_from
    facts = engine_facts(hello) if hello is not None else None
    tokens_per_id = (
        hello.hash_block_size if hello is not None else request.app.state.settings.block_size
    )
    since = None if window_s is None else time.time() - window_s
    lines = charged_lines(
        request, traffic_lines(client.traffic, tokens_per_id, facts, since, limit)
    )
    name = f"blockpool-mirror-trace-{int(time.time())}.jsonl"
    headers = {"Content-Disposition": f'attachment; filename="{name}"', "Vary": "Accept-Encoding"}
    if accepts_gzip(request):
        return NDJSONResponse(gzip_stream(lines), headers={**headers, "Content-Encoding": "gzip"})
    return NDJSONResponse(lines, headers=headers)
