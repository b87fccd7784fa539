"""``GET /api/mirror``: is the dashboard's pool the engine's, exactly?"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from app.api.costly import CostlyRead
from app.api.deps import ReadAuth
from app.core.errors import NotFound
from app.web.errors import ERROR_RESPONSES
from blockpool.mirror.digest import pool_digest

router = APIRouter(prefix="/api", tags=["mirror"], responses=ERROR_RESPONSES)


def _client(request: Request) -> Any:
    client = getattr(request.app.state, "mirror", None)
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
