"""How uvicorn serves both apps (``blockpool serve`` and ``blockpool observe``).

What a client's connection may hold, and for how long:

- **Headers**: a connection must deliver a request's line and headers within
  ``header_timeout_s`` of opening (or of the previous response's end), else
  it is answered 408 ``request_timeout`` and closed (``DeadlineProtocol``).
  uvicorn's own keep-alive timeout only starts after a response, and any byte
  restarts it: a client that sends nothing, or one header byte a second,
  would hold its connection for ever.
- **Body**: the whole body within ``body_timeout_s`` of its headers, else 408
  ``body_timeout`` (``BodyDeadline``, an ASGI middleware both apps get from
  ``app.web.assembly.guard``).
- **Idle**: ``keep_alive_s`` between requests (uvicorn's ``timeout_keep_alive``).
- **Slots**: at most ``max_connections`` connections at once (websockets
  included); one more is answered 503 ``too_many_connections`` and closed.
- **Forwarded headers** (``X-Forwarded-For``, ``X-Forwarded-Proto``) are
  ignored unless ``forwarded_allow_ips`` names the proxies to trust: uvicorn
  trusts them from 127.0.0.1 by default, which let any local client pick its
  own address for the costly-read ration.

``ServingSettings`` holds these settings for both apps' settings classes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import HTTPException
from pydantic import Field
from pydantic_settings import BaseSettings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.shared.errors import error_body, send_error

DEFAULT_BODY_TIMEOUT_S = 30.0


class ServingSettings(BaseSettings):
    """The connection limits of ``blockpool serve`` and ``blockpool observe``."""

    forwarded_allow_ips: str | None = Field(
        default=None,
        description="proxy addresses (comma-separated, '*': any) whose X-Forwarded-For "
        "/ -Proto headers are trusted; none: those headers are ignored",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="seconds a connection has to send a request's headers",
    )
    body_timeout_s: float = Field(
        default=DEFAULT_BODY_TIMEOUT_S,
        gt=0,
        le=3600,
        description="seconds a request has to send its whole body",
    )
    keep_alive_s: int = Field(
        default=5, ge=1, le=3600, description="seconds an idle connection is kept open"
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="connections open at once, websockets included (beyond: 503)",
    )


# ------------------------------------------------------------- the headers


def _raw_error(status: int, reason: str, code: str, message: str) -> bytes:
    """A whole HTTP response in the one error shape, closing the connection."""
    body = json.dumps(error_body(status, code, message)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def deadline_protocol(
    base: type[asyncio.Protocol], header_timeout_s: float, max_connections: int | None = None
) -> type[Any]:
    """``base`` (one of uvicorn's HTTP protocols) with a header deadline and
    a bound on the connections open at once."""

    class DeadlineProtocol(base):  # type: ignore[valid-type,misc]
        _deadline: asyncio.TimerHandle | None = None
        _armed_for: object = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if max_connections is not None and len(self.connections) > max_connections:
                transport.write(
                    _raw_error(
                        503,
                        "Service Unavailable",
                        "too_many_connections",
                        f"the server holds {max_connections} connections, its limit: retry later",
                    )
                )
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers, in time too

        def _arm(self) -> None:
            self._disarm()
            self._armed_for = self.cycle  # a new cycle: the headers came
            self._deadline = self.loop.call_later(header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self:
                return  # closed, or upgraded to a websocket
            if self.cycle is not self._armed_for:
                return  # a request's headers arrived: the body has its own deadline
            transport.write(
                _raw_error(
                    408,
                    "Request Timeout",
                    "request_timeout",
                    "the request's headers did not arrive in time: the connection is closed",
                )
            )
            transport.close()

    DeadlineProtocol.__name__ = f"Deadline{base.__name__}"
    return DeadlineProtocol


GRACEFUL_SHUTDOWN_S = 10


def uvicorn_config(
    app: Any,
    host: str,
    port: int,
    log_level: str,
    limits: ServingSettings,
    ws_max_size: int = 4096,
) -> Any:
    """The uvicorn config both apps are served with."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=deadline_protocol(AutoHTTPProtocol, limits.header_timeout_s, limits.max_connections),
        ws="websockets-sansio",
        # No per-connection deflate: it would compress every frame once per
        # client (serve compresses once per tick on request: ?compress=zlib).
        ws_per_message_deflate=False,
        # Clients only send small control messages: a bigger one closes the
        # socket (1009) before it is buffered, let alone parsed.
        ws_max_size=ws_max_size,
        proxy_headers=limits.forwarded_allow_ips is not None,
        forwarded_allow_ips=limits.forwarded_allow_ips or "",
        timeout_keep_alive=limits.keep_alive_s,
        # a stop (a signal, a mirror's rebuild) closes what is still open
        # after this long: a dashboard's stream never holds the server up
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # (requests at once: each connection runs one at a time, so the
        # connection bound above bounds them; uvicorn's own limit would
        # answer a plain-text 503)
    )


# ---------------------------------------------------------------- the body


class _BodyTimedOut(HTTPException):
    """Raised while the body streams in: the app's handler for HTTP errors
    answers it in the one error shape (FastAPI re-raises HTTPExceptions)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {timeout_s:g} s",
            headers={"connection": "close"},
        )
        self.details = {"timeout_s": timeout_s}


class BodyDeadline:
    """408 ``body_timeout`` when a request's body is not whole within
    ``timeout_s`` of the request reaching the app (see the module doc)."""

    def __init__(self, app: ASGIApp, timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout_s
        whole = False
        started = False

        async def timed_receive() -> Message:
            nonlocal whole
            if whole:  # the body is in: later calls wait for a disconnect
                return await receive()
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), max(left, 0.001))
            except TimeoutError:
                raise _BodyTimedOut(self.timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                whole = True
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, watched_send)
        except _BodyTimedOut:
            if started:
                raise
            await send_error(
                send,
                408,
                "body_timeout",
                f"the request body did not arrive within {self.timeout_s:g} s",
                {"timeout_s": self.timeout_s},
                close=True,
            )
