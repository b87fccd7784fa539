"""Start, stop and tune the demo workload."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.api.deps import ReadAuth, WriteAuth
from app.api.errors import ERROR_RESPONSES
from app.api.responses import requests as r
from app.api.responses import returns
from app.demo import DemoWorkload
from app.schemas import DemoConfig

router = APIRouter(prefix="/api/demo", tags=["demo"], responses=ERROR_RESPONSES)


def _demo(request: Request) -> DemoWorkload:
    demo: DemoWorkload = request.app.state.demo
    return demo


@router.get(
    "", responses=returns(r.DemoStatus), dependencies=[ReadAuth], summary="Demo workload status"
)
async def status(request: Request) -> dict[str, Any]:
    return _demo(request).status()


@router.post(
    "/start",
    responses=returns(r.DemoStatus),
    dependencies=[WriteAuth],
    summary="Start the demo workload",
)
async def start(request: Request) -> dict[str, Any]:
    demo = _demo(request)
    async with demo.transition():  # one workload at a time: 409 while a trace runs
        demo.start()
    return demo.status()


@router.post(
    "/stop",
    responses=returns(r.DemoStatus),
    dependencies=[WriteAuth],
    summary="Stop it (running requests finish)",
)
async def stop(request: Request) -> dict[str, Any]:
    return await _demo(request).stop_now()


@router.post(
    "/config",
    responses=returns(r.DemoStatus),
    dependencies=[WriteAuth],
    summary="Tune rate, mix, decode length",
)
async def configure(request: Request, body: DemoConfig) -> dict[str, Any]:
    demo = _demo(request)
    demo.configure(**body.model_dump(exclude_none=True))
    return demo.status()
