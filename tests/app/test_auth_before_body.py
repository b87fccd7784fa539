"""A client without the token is refused before its body is read: an 8 MB
POST to a mutating endpoint is answered 401 on its headers alone (FastAPI
reads and parses a body before a route's dependencies run), and a costly
read under ``protect_reads`` likewise; with the token the body is read and
the operation applied."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.app.conftest import LiveServer, free_port, make_app, raw_answer

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"
MB8 = 8 * 1024 * 1024 - 1024


async def call(app: Any, path: str, headers: dict[str, str], chunks: int) -> tuple[int, int, Any]:
    """POST ``chunks`` 64 KiB chunks of body; (status, chunks the app read, body)."""
    read = 0
    chunk = b" " * 65536

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read >= chunks:
            await asyncio.sleep(3600)  # (never reached: the body is whole)
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": read < chunks}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw += [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
            (b"content-length", str(chunks * 65536).encode())]  # fmt: skip
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": raw, "client": ("10.0.0.1", 1), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    await asyncio.wait_for(app(scope, receive, send), 60)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, read, json.loads(body)


async def test_no_body_is_read_before_the_401() -> None:
    app = make_app(token=TOKEN, protect_reads=True)
    async with app.router.lifespan_context(app):
        before = app.state.engine.pool.get_num_free_blocks()
        for path in (
            "/api/pool/allocate",
            "/api/batch",
            "/api/requests",
            "/api/pool/prefix-lookup",
        ):
            for headers in ({}, {"authorization": "Bearer wrong"}):
                status, read, body = await call(app, path, headers, MB8 // 65536)
                assert status == 401 and body["error"]["code"] == "unauthorized", (path, body)
                assert read == 0, path  # not one chunk of the body was taken
        # with the token, the body is read (it is 8 MB of spaces: invalid JSON)
        status, read, body = await call(
            app, "/api/pool/allocate", {"authorization": f"Bearer {TOKEN}"}, 4
        )
        assert status == 422 and read == 4
        assert app.state.engine.pool.get_num_free_blocks() == before
        app.state.engine.check()


def test_a_live_server_answers_401_without_waiting_for_the_body() -> None:
    with LiveServer(make_app(token=TOKEN), free_port()).running() as server:
        answer = raw_answer(
            server.port,
            b"POST /api/pool/allocate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n",
        )  # and no body at all: the old server waited for it
        assert answer.startswith(b"HTTP/1.1 401 "), answer
