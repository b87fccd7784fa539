"""The websocket endpoint ``/api/stream`` and ``POST /api/stream/ticket``.

Query: ``channels`` (comma list of blocks, events, series, samples, analysis;
default all), ``resume_from`` (the first seq the client still needs) with
``epoch`` (the server epoch those seqs belong to), ``compress=zlib`` (frames
compressed once per tick, shared by every such client).  When the server
protects reads, the credentials of ``app.auth`` (a ``bearer.`` or ``ticket.``
subprotocol, ``Authorization``, or — discouraged — ``?token=``).

Client messages (JSON text, at most ``ws_max_message_bytes``, checked before
anything parses them): ``{"type": "resume", "from": N}`` after a gap,
``{"type": "snapshot"}``.  Each client may ask for ``stream_request_burst``
of them at once, refilled at ``stream_request_rate`` a second; a refused or
malformed message gets a JSON text notice, the next one is read only when
the budget allows (0.1-0.5 s later: what a flood sends meanwhile waits in the
peer's socket, unparsed), and ``stream_max_refused`` refusals within a
minute close the socket (1008).  Close codes: docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from typing import Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect

from app.api.deps import ReadAuth
from app.api.responses import returns
from app.api.responses.stream import Ticket
from app.auth import accept_subprotocol, websocket_credentials, websocket_token_ok
from app.stream import protocol as p
from app.stream.hub import Client, StreamHub
from app.stream.limits import TokenBucket, parse_message, parse_seq

logger = logging.getLogger("blockpool.stream")
router = APIRouter()

CLOSE_UNAUTHORIZED = 4401  # no or a wrong credential
CLOSE_POLICY = 1008  # kept asking past its budget (or kept sending junk)
CLOSE_TOO_BIG = 1009  # a message over ws_max_message_bytes
CLOSE_UNSUPPORTED = 1003  # a binary message: the stream takes JSON text only
CLOSE_TIMEOUT_S = 5.0  # a peer that does not read cannot hold a closing handler
# After a refusal the next message is read no sooner than the budget allows
# (within these bounds): a flood then waits in the peer's socket, unparsed.
PAUSE_S = (0.1, 0.5)
REFUSED_WINDOW_S = 60.0  # stream_max_refused refusals within this: closed (1008)


def _subprotocols(ws: WebSocket) -> list[str]:
    return list(ws.scope.get("subprotocols") or [])


def _authorized(ws: WebSocket, hub: StreamHub) -> bool:
    settings = ws.app.state.settings
    if settings.token is None or not settings.protect_reads:
        return True
    creds = websocket_credentials(ws.headers, _subprotocols(ws), ws.query_params)
    return websocket_token_ok(creds, settings.token, hub.tickets)


async def _sender(ws: WebSocket, hub: StreamHub, client: Client) -> None:
    while True:
        frame = await client.queue.get()
        client.sending = True
        try:
            await ws.send_bytes(frame)
        finally:
            client.sending = False
        hub.record_sent(client, frame)


def _notice(code: str, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "code": code, "message": message, **extra})


async def _receiver(ws: WebSocket, hub: StreamHub, client: Client) -> tuple[int, str] | None:
    """Handle the client's messages; the close (code, reason) it earned, or
    None when the peer went away."""
    settings = ws.app.state.settings
    limit: int = settings.ws_max_message_bytes
    max_refused: int = settings.stream_max_refused
    bucket = client.bucket
    assert bucket is not None
    client.refused = deque(maxlen=max_refused)
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        if text is None:
            return CLOSE_UNSUPPORTED, "the stream takes JSON text messages only"
        # the size first (len() is free; the encoded size only for a short one)
        if len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit:
            return CLOSE_TOO_BIG, f"message too big: at most {limit} bytes"
        request = parse_message(text)
        notice: str | None = None
        if request is None:
            notice = _notice(
                "bad_message",
                'expected {"type": "resume", "from": N} or {"type": "snapshot"}',
            )
        elif not bucket.take(time.monotonic()):
            wait = round(bucket.wait_s(), 3)
            notice = _notice(
                "rate_limited",
                f"too many resume/snapshot requests: at most {settings.stream_request_burst} "
                f"at once and {settings.stream_request_rate:g} per second",
                retry_after_s=wait,
            )
        if notice is not None:
            now = time.monotonic()
            client.refused.append(now)
            hub.counts.refused += 1
            if len(client.refused) >= max_refused and now - client.refused[0] <= REFUSED_WINDOW_S:
                return CLOSE_POLICY, f"{max_refused} refused messages within a minute"
            await ws.send_text(notice)
            await asyncio.sleep(min(max(bucket.wait_s(), PAUSE_S[0]), PAUSE_S[1]))
            continue
        assert request is not None
        if request.kind == "resume" and request.from_seq is not None:
            hub._drop_queue(client)
            if not hub.resume(client, request.from_seq):
                hub.request_snapshot(client)
        else:
            hub.request_snapshot(client)


def _channels(raw: str | None) -> frozenset[str]:
    chosen = {c.strip() for c in raw.split(",")} if raw else set(p.CHANNELS)
    return frozenset(c for c in chosen if c in p.CHANNELS) or frozenset(p.CHANNELS)


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ws.close(code=code, reason=reason), CLOSE_TIMEOUT_S)


@router.post("/api/stream/ticket", responses=returns(Ticket), dependencies=[ReadAuth])
async def stream_ticket(request: Request) -> dict[str, Any]:
    """A single-use ticket for the stream, valid for ``expires_in`` seconds:
    connect with the subprotocols ``["blockpool", "ticket.<ticket>"]`` (or
    ``?ticket=``) instead of showing the token to the websocket."""
    hub: StreamHub = request.app.state.stream
    return {"ticket": hub.tickets.issue(), "expires_in": hub.tickets.ttl_s}


@router.websocket("/api/stream")
async def stream(ws: WebSocket) -> None:
    hub: StreamHub = ws.app.state.stream
    settings = ws.app.state.settings
    subprotocol = accept_subprotocol(_subprotocols(ws))
    if not _authorized(ws, hub):
        # Accept, then close with a code a browser can read (a refused
        # handshake only shows up as a failed connection there).
        await ws.accept(subprotocol=subprotocol)
        await _close(ws, CLOSE_UNAUTHORIZED, "token required")
        return
    channels = _channels(ws.query_params.get("channels"))
    resume_from = parse_seq(ws.query_params.get("resume_from"))
    if ws.query_params.get("epoch") != hub.epoch:
        resume_from = None  # another server (restart): seqs mean nothing here
    compress = ws.query_params.get("compress") in ("zlib", "1", "true")
    await ws.accept(subprotocol=subprotocol)
    client = hub.connect(channels, resume_from, compress)
    client.bucket = TokenBucket.full(
        settings.stream_request_rate, settings.stream_request_burst, time.monotonic()
    )
    sender = asyncio.create_task(_sender(ws, hub, client))
    receiver = asyncio.create_task(_receiver(ws, hub, client))
    verdict: tuple[int, str] | None = None
    try:
        await asyncio.wait((sender, receiver), return_when=asyncio.FIRST_COMPLETED)
        if receiver.done() and not receiver.cancelled() and receiver.exception() is None:
            verdict = receiver.result()
    finally:
        hub.disconnect(client)
        for task in (sender, receiver):
            task.cancel()
        for task in (sender, receiver):
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                await task
    if verdict is not None:
        logger.info("stream client closed: %d %s", *verdict)
        await _close(ws, *verdict)
