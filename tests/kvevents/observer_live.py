"""A real observer app served by uvicorn on loopback, its REST client and its
websocket ticks: what the observer tests share."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from app.observer.app import create_observer_app
from app.shared.settings import ObserverSettings
from tests.kvevents.helpers import await_for
from tests.support.ports import free_port


@asynccontextmanager
async def serving(app: FastAPI, port: int) -> AsyncIterator[FastAPI]:
    """Serve ``app`` on 127.0.0.1:``port`` until the block ends."""
    app.state.port = port
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                       ws="websockets-sansio", ws_per_message_deflate=False)
    )  # fmt: skip
    task = asyncio.create_task(server.serve())
    await await_for(lambda: server.started, what="uvicorn to start")
    try:
        yield app
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def live_observer(**settings: Any) -> AsyncIterator[FastAPI]:
    """An observer with these settings (a free port, 20 ticks a second)."""
    port = free_port()
    app = create_observer_app(ObserverSettings(port=port, tick_hz=20, **settings))
    async with serving(app, port):
        yield app


def client(app: FastAPI, token: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{app.state.port}", timeout=20, headers=headers
    )


async def ws_ticks(
    ws: Any, until: Callable[[dict[str, Any]], bool], timeout: float = 15.0
) -> list[dict[str, Any]]:
    """The stream's ticks until one satisfies ``until``."""
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while True:
            m = json.loads(await ws.recv())
            assert m["type"] == "tick", m
            out.append(m)
            if until(m):
                return out
