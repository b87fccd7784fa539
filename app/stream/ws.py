"""The websocket endpoint ``/api/stream``.

Query: ``channels`` (comma list of blocks, events, series, samples; default
all), ``resume_from`` (the first seq the client still needs) with ``epoch``
(the server epoch those seqs belong to), ``compress=zlib`` (frames compressed
once per tick, shared by every such client), ``token`` (when the server
protects reads).  Client messages (JSON text):
``{"type": "resume", "from": N}`` after a gap, ``{"type": "snapshot"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from app.stream import protocol as p
from app.stream.hub import Client, StreamHub

logger = logging.getLogger("blockpool.stream")
router = APIRouter()


def _authorized(ws: WebSocket) -> bool:
    settings = ws.app.state.settings
    if settings.token is None or not settings.protect_reads:
        return True
    given = ws.query_params.get("token")
    if given is None:
        auth = ws.headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer":
            return False
    return hmac.compare_digest(given.strip(), settings.token)


async def _sender(ws: WebSocket, hub: StreamHub, client: Client) -> None:
    while True:
        frame = await client.queue.get()
        client.sending = True
        try:
            await ws.send_bytes(frame)
        finally:
            client.sending = False
        hub.record_sent(client, frame)


async def _receiver(ws: WebSocket, hub: StreamHub, client: Client) -> None:
    while True:
        text = await ws.receive_text()
        try:
            msg = json.loads(text)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        kind = msg.get("type")
        if kind == "resume" and isinstance(msg.get("from"), int):
            hub._drop_queue(client)
            if not hub.resume(client, msg["from"]):
                hub.request_snapshot(client)
        elif kind == "snapshot":
            hub.request_snapshot(client)


@router.websocket("/api/stream")
async def stream(ws: WebSocket) -> None:
    hub: StreamHub = ws.app.state.stream
    if not _authorized(ws):
        # Accept, then close with a code a browser can read (a refused
        # handshake only shows up as a failed connection there).
        await ws.accept()
        await ws.close(code=4401, reason="token required")
        return
    raw = ws.query_params.get("channels")
    chosen = {c.strip() for c in raw.split(",")} if raw else set(p.CHANNELS)
    channels = frozenset(c for c in chosen if c in p.CHANNELS) or frozenset(p.CHANNELS)
    resume = ws.query_params.get("resume_from")
    resume_from = int(resume) if resume and resume.isdigit() else None
    if ws.query_params.get("epoch") != hub.epoch:
        resume_from = None  # another server (restart): seqs mean nothing here
    compress = ws.query_params.get("compress") in ("zlib", "1", "true")
    await ws.accept()
    client = hub.connect(channels, resume_from, compress)
    tasks = [
        asyncio.create_task(_sender(ws, hub, client)),
        asyncio.create_task(_receiver(ws, hub, client)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hub.disconnect(client)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                await task
