"""Start, stop and tune the demo workload."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.api.declare import route
from app.api.deps import ReadAuth, WriteAuth
from app.pool.demo import DemoWorkload
from app.pool.schemas import DemoConfig
from app.pool.views import requests as r
from app.web.error_shape import ERROR_RESPONSES

router = APIRouter(prefix="/api/demo", tags=["demo"], responses=ERROR_RESPONSES)


def _demo(request: Request) -> DemoWorkload:
    demo: DemoWorkload = request.app.state.demo
    return demo


@route(router.get, "", r.DemoStatus, "Demo workload status", ReadAuth)
async def status(request: Request) -> dict[str, Any]:
    return _demo(request).status()


@route(router.post, "/start", r.DemoStatus, "Start the demo workload", WriteAuth)
async def start(request: Request) -> dict[str, Any]:
    demo = _demo(request)
    async with demo.transition():  # one workload at a time: 409 while a trace runs
        demo.start()
    return demo.status()


@route(router.post, "/stop", r.DemoStatus, "Stop it (running requests finish)", WriteAuth)
async def stop(request: Request) -> dict[str, Any]:
    return await _demo(request).stop_now()


@route(router.post, "/config", r.DemoStatus, "Tune rate, mix, decode length", WriteAuth)
async def configure(request: Request, body: DemoConfig) -> dict[str, Any]:
    demo = _demo(request)
    demo.configure(**body.model_dump(exclude_none=True))
    return demo.status()
