"""The websocket endpoint ``/api/stream`` and ``POST /api/stream/ticket``.

Query: ``channels`` (comma list of blocks, events, series, samples, analysis;
default all), ``resume_from`` (the first seq the client still needs) with
``epoch`` (the server epoch those seqs belong to), ``compress=zlib`` (frames
compressed once per tick, shared by every such client).  When the server
protects reads, the credentials of ``app.shared.auth`` (a ``bearer.`` or ``ticket.``
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
import json
import time
from collections import deque
from typing import Any

from fastapi import APIRouter, Request, WebSocket

from app.api.declare import returns
from app.api.deps import ReadAuth
from app.pool.views.stream import Ticket
from app.stream import protocol as p
from app.stream.hub import Client, StreamHub
from app.stream.intake import TokenBucket, parse_message, parse_seq
from app.web import ws_endpoint
from app.web.ws_endpoint import CLOSE_POLICY, Verdict

router = APIRouter()

# After a refusal the next message is read no sooner than the budget allows
# (within these bounds): a flood then waits in the peer's socket, unparsed.
PAUSE_S = (0.1, 0.5)
REFUSED_WINDOW_S = 60.0  # stream_max_refused refusals within this: closed (1008)


def _notice(code: str, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "code": code, "message": message, **extra})


class _Requests:
    """One client's resume / snapshot requests, within its budget."""

    def __init__(self, ws: WebSocket, hub: StreamHub, client: Client) -> None:
        settings = ws.app.state.settings
        self.ws, self.hub, self.client, self.settings = ws, hub, client, settings
        self.max_refused: int = settings.stream_max_refused
        client.bucket = TokenBucket.full(
            settings.stream_request_rate, settings.stream_request_burst, time.monotonic()
        )
        client.refused = deque(maxlen=self.max_refused)

    async def __call__(self, text: str) -> Verdict | None:
        client, hub, settings = self.client, self.hub, self.settings
        bucket = client.bucket
        assert bucket is not None
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
            max_refused = self.max_refused
            if len(client.refused) >= max_refused and now - client.refused[0] <= REFUSED_WINDOW_S:
                return CLOSE_POLICY, f"{max_refused} refused messages within a minute"
            await self.ws.send_text(notice)
            await asyncio.sleep(min(max(bucket.wait_s(), PAUSE_S[0]), PAUSE_S[1]))
            return None
        assert request is not None
        if request.kind == "resume" and request.from_seq is not None:
            client.clear()
            if not hub.resume(client, request.from_seq):
                hub.request_snapshot(client)
        else:
            hub.request_snapshot(client)
        return None


def _channels(raw: str | None) -> frozenset[str]:
    chosen = {c.strip() for c in raw.split(",")} if raw else set(p.CHANNELS)
    return frozenset(c for c in chosen if c in p.CHANNELS) or frozenset(p.CHANNELS)


@router.post("/api/stream/ticket", responses=returns(Ticket), dependencies=[ReadAuth])
async def stream_ticket(request: Request) -> Ticket:
    """A single-use ticket for the stream, valid for ``expires_in`` seconds:
    connect with the subprotocols ``["blockpool", "ticket.<ticket>"]`` (or
    ``?ticket=``) instead of showing the token to the websocket."""
    hub: StreamHub = request.app.state.stream
    return Ticket(ticket=hub.tickets.issue(), expires_in=hub.tickets.ttl_s)


@router.websocket("/api/stream")
async def stream(ws: WebSocket) -> None:
    hub: StreamHub = ws.app.state.stream
    settings = ws.app.state.settings
    token = settings.token if settings.protect_reads else None
    if not await ws_endpoint.accept(ws, ws_endpoint.authorized(ws, token, hub.tickets)):
        return
    channels = _channels(ws.query_params.get("channels"))
    resume_from = parse_seq(ws.query_params.get("resume_from"))
    if ws.query_params.get("epoch") != hub.epoch:
        resume_from = None  # another server (restart): seqs mean nothing here
    compress = ws.query_params.get("compress") in ("zlib", "1", "true")
    client = hub.connect(channels, resume_from, compress)
    await ws_endpoint.serve(
        ws,
        hub.fan,
        client,
        max_message_bytes=settings.ws_max_message_bytes,
        on_message=_Requests(ws, hub, client),
    )
