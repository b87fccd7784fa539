"""Replay a production trace on the live engine: upload, start, stop, inspect.

Uploads (the raw JSON lines as the body) are bounded by the server's body
limit and by what the trace implies (requests, tokens a request and in all,
the pool, tokens per id, arrival times: ``app.trace.limits.check_trace``), and
validated whole before anything changes; a bad one is a 422 naming the
line, the field and the limit.  Starts and stops are serialized with the
demo's (one workload at a time: a 409 names the one running).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Query, Request
from starlette.requests import ClientDisconnect

from app.api.declare import route
from app.api.deps import ReadAuth, WriteAuth
from app.pool.views.trace import TraceStatus
from app.shared.errors import InvalidInput, TooLarge
from app.trace.driver import TraceDriver
from app.trace.limits import MAX_TOKENS_PER_ID, service_limits
from app.web.error_shape import ERROR_RESPONSES
from blockpool.trace import TraceError, parse_trace

logger = logging.getLogger("blockpool.trace")
# the reader's limits -> the settings that set them here
SETTING_OF_LIMIT = {
    "max_requests": "trace_max_requests",
    "max_tokens_per_request": "max_tokens_per_request",
    "max_total_tokens": "trace_max_tokens",
}
router = APIRouter(prefix="/api/trace", tags=["trace"], responses=ERROR_RESPONSES)


def _driver(request: Request) -> TraceDriver:
    driver: TraceDriver = request.app.state.trace_driver
    return driver


async def _body(request: Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes; a client gone mid-body is one log line."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:  # the body limit refuses it earlier; never hold more
                raise TooLarge(f"the trace is over the limit of {limit} bytes", limit=limit)
            chunks.append(chunk)
    except ClientDisconnect:
        logger.info("trace upload abandoned by the client after %d bytes", size)
        raise InvalidInput("the upload was cut off before its end", received_bytes=size) from None
    return b"".join(chunks)


@route(router.get, "", TraceStatus, "Trace replay status, progress, hit rate", ReadAuth)
async def status(request: Request) -> TraceStatus:
    return _driver(request).status()


@route(
    router.post,
    "/upload",
    TraceStatus,
    "Load a trace (Mooncake JSON lines or a recording as the body)",
    WriteAuth,
)
async def upload(
    request: Request,
    name: str = Query("upload", max_length=200),
    tokens_per_id: int = Query(512, ge=1, le=MAX_TOKENS_PER_ID),
) -> TraceStatus:
    settings = request.app.state.settings
    body = await _body(request, settings.max_body_bytes)
    try:
        trace = parse_trace(body, tokens_per_id, service_limits(settings))
    except TraceError as exc:
        details = {"line": exc.line, "field": exc.field, "limit": exc.limit}
        if exc.limit in SETTING_OF_LIMIT:
            details["setting"] = SETTING_OF_LIMIT[exc.limit]
        raise InvalidInput(f"trace: {exc}", **details) from None
    driver = _driver(request)
    async with driver.transition():
        driver.load(trace, name)
    return driver.status()


@route(router.post, "/start", TraceStatus, "Start (or resume) the replay", WriteAuth)
async def start(
    request: Request,
    speed: float | None = Query(None, gt=0, le=10_000),
    loop: bool | None = None,
) -> TraceStatus:
    driver = _driver(request)
    async with driver.transition():  # one workload at a time: 409 while the demo runs
        driver.ensure_startable()  # refused before anything changes
        driver.configure(speed=speed, loop=loop)
        driver.start()
    return driver.status()


@route(router.post, "/stop", TraceStatus, "Stop it (running requests finish)", WriteAuth)
async def stop(request: Request) -> TraceStatus:
    return await _driver(request).stop_now()
