"""Serving one websocket subscriber: the handshake's credentials, a sender
that never blocks the broadcaster, a receiver that bounds what the peer
sends, and a close that a stalled peer cannot hold up.

Used by the pool stream (``/api/stream``) and the observer
(``/api/fleet/stream``).  The peer's messages: JSON text of at most
``max_message_bytes`` (checked before anything parses them; larger: closed
1009; binary: closed 1003), each handed to the owner's ``on_message``, which
may answer with a close verdict.  Should handling a message fail, only that
connection closes (1011): one message cannot end anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import WebSocket, WebSocketDisconnect

from app.shared.auth import (
    TicketBook,
    accept_subprotocol,
    websocket_credentials,
    websocket_token_ok,
)
from app.web.broadcast import Broadcaster, Subscriber

logger = logging.getLogger("blockpool.websocket")

CLOSE_UNAUTHORIZED = 4401  # no or a wrong credential
CLOSE_POLICY = 1008  # kept asking past its budget (or kept sending junk)
CLOSE_TOO_BIG = 1009  # a message over max_message_bytes
CLOSE_UNSUPPORTED = 1003  # a binary message: JSON text only
CLOSE_INTERNAL = 1011  # handling the peer's message failed
CLOSE_TIMEOUT_S = 5.0  # a peer that does not read cannot hold a closing handler
MAX_MESSAGE_BYTES = 4096  # what a peer may send in one message, unless told otherwise

T = TypeVar("T", bytes, str)
Verdict = tuple[int, str]  # (close code, reason)
OnMessage = Callable[[str], Awaitable[Verdict | None]]


def offered_subprotocols(ws: WebSocket) -> list[str]:
    return list(ws.scope.get("subprotocols") or [])


def authorized(ws: WebSocket, token: str | None, tickets: TicketBook | None = None) -> bool:
    """True without a token; else when the handshake carries it (or a ticket)."""
    if token is None:
        return True
    creds = websocket_credentials(ws.headers, offered_subprotocols(ws), ws.query_params)
    return websocket_token_ok(creds, token, tickets)


async def accept(ws: WebSocket, allowed: bool, reason: str = "token required") -> bool:
    """Accept the socket (echoing only ``blockpool``, never a credential);
    when not ``allowed``, close it at once with 4401 -- a code a browser can
    read, where a refused handshake only shows up as a failed connection."""
    await ws.accept(subprotocol=accept_subprotocol(offered_subprotocols(ws)))
    if not allowed:
        await close(ws, (CLOSE_UNAUTHORIZED, reason))
    return allowed


async def close(ws: WebSocket, verdict: Verdict) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ws.close(code=verdict[0], reason=verdict[1]), CLOSE_TIMEOUT_S)


async def _sender(ws: WebSocket, fan: Broadcaster[T], sub: Subscriber[T]) -> None:
    while True:
        item = await sub.queue.get()
        sub.sending = True
        try:
            if isinstance(item, bytes):
                await ws.send_bytes(item)
            else:
                await ws.send_text(item)
        finally:
            sub.sending = False
        fan.sent(sub, item)


async def _receiver(
    ws: WebSocket, fan: Broadcaster[T], limit: int, on_message: OnMessage | None
) -> Verdict | None:
    """The peer's messages until it goes away (None) or earns a close."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        if text is None:
            fan.counts.refused += 1
            return CLOSE_UNSUPPORTED, "JSON text messages only"
        # the size first (len() is free; the encoded size only for a short one)
        if len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit:
            fan.counts.refused += 1
            return CLOSE_TOO_BIG, f"message too big: at most {limit} bytes"
        if on_message is None:
            continue
        try:
            verdict = await on_message(text)
        except Exception:
            fan.counts.refused += 1
            logger.exception("a websocket message could not be handled")
            return CLOSE_INTERNAL, "the message could not be handled"
        if verdict is not None:
            return verdict


async def serve(
    ws: WebSocket,
    fan: Broadcaster[T],
    sub: Subscriber[T],
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    on_message: OnMessage | None = None,
) -> None:
    """Send ``sub``'s queue and read the peer until either side ends; then
    ``sub`` leaves ``fan`` and the socket is closed with the verdict earned."""
    sender = asyncio.create_task(_sender(ws, fan, sub))
    receiver = asyncio.create_task(_receiver(ws, fan, max_message_bytes, on_message))
    verdict: Verdict | None = None
    try:
        await asyncio.wait((sender, receiver), return_when=asyncio.FIRST_COMPLETED)
        if receiver.done() and not receiver.cancelled() and receiver.exception() is None:
            verdict = receiver.result()
    finally:
        fan.remove(sub)
        for task in (sender, receiver):
            task.cancel()
        for task in (sender, receiver):
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                await task
    if verdict is not None:
        logger.info("websocket client closed: %d %s", *verdict)
        await close(ws, verdict)
