"""Replay a production trace on the live engine: upload, start, stop, inspect.

Uploads (the raw JSON lines as the body) are bounded by the server's body
limit and validated whole -- every row, the token ids, the request sizes --
before anything changes; a bad one is a 422 naming the line.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from app.api.deps import ReadAuth, WriteAuth
from app.api.errors import ERROR_RESPONSES
from app.api.responses import returns
from app.api.responses.trace import TraceStatus
from app.errors import Conflict, InvalidInput, TooLarge
from app.trace_driver import TraceDriver
from blockpool.trace import TraceError, parse_trace

router = APIRouter(prefix="/api/trace", tags=["trace"], responses=ERROR_RESPONSES)


def _driver(request: Request) -> TraceDriver:
    driver: TraceDriver = request.app.state.trace_driver
    return driver


@router.get(
    "",
    responses=returns(TraceStatus),
    dependencies=[ReadAuth],
    summary="Trace replay status, progress, hit rate",
)
async def status(request: Request) -> dict[str, Any]:
    return _driver(request).status()


@router.post(
    "/upload",
    responses=returns(TraceStatus),
    dependencies=[WriteAuth],
    summary="Load a trace (Mooncake JSON lines or a recording as the body)",
)
async def upload(
    request: Request,
    name: str = Query("upload", max_length=200),
    tokens_per_id: int = Query(512, ge=1, le=1 << 20),
) -> dict[str, Any]:
    body = await request.body()
    limit = request.app.state.settings.max_body_bytes
    if len(body) > limit:  # the body limit refuses it earlier; never parse more
        raise TooLarge(f"the trace is over the limit of {limit} bytes", limit=limit)
    try:
        trace = parse_trace(body, tokens_per_id)
    except TraceError as exc:
        raise InvalidInput(f"trace: {exc}", line=exc.line) from None
    driver = _driver(request)
    driver.load(trace, name)
    return driver.status()


@router.post(
    "/start",
    responses=returns(TraceStatus),
    dependencies=[WriteAuth],
    summary="Start (or resume) the replay",
)
async def start(
    request: Request,
    speed: float | None = Query(None, gt=0, le=10_000),
    loop: bool | None = None,
) -> dict[str, Any]:
    driver = _driver(request)
    if request.app.state.demo.running_task:
        raise Conflict("the demo workload is running: stop it first (POST /api/demo/stop)")
    driver.configure(speed=speed, loop=loop)
    driver.start()
    return driver.status()


@router.post(
    "/stop",
    responses=returns(TraceStatus),
    dependencies=[WriteAuth],
    summary="Stop it (running requests finish)",
)
async def stop(request: Request) -> dict[str, Any]:
    driver = _driver(request)
    await driver.stop()
    return driver.status()
