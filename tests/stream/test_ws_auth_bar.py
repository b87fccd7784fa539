"""Bar 13-ws-auth, against the real command line (``blockpool serve``) in a
child process, its log captured: with a token and protected reads, wrong
tokens (non-ASCII ones included, in every place a token can travel) are
refused with no exception in the log, the right token gets the stream, an
oversized client message is cut off by the server (1009), and neither the
token nor a wrong one ever appears in the log."""

from __future__ import annotations

import asyncio
import base64
import socket
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from app.stream import protocol as p
from app.stream.client import StreamClient
from tests.support.cli import start_cli_server, stop_cli_server
from tests.support.ports import free_port

TOKEN = "s3cret-Tok3n-9f2c"
WRONG = TOKEN + "\u00e9\u00b2"  # non-ASCII, and holding the right token


def _raw_handshake(port: int, extra: bytes) -> tuple[int, int | None]:
    """A handshake with raw header bytes (non-ASCII ones no client library
    sends): (HTTP status, close code of the first frame after a 101)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n" + extra + b"\r\n"
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, f"the server hung up mid-answer: {data!r}"
            data += chunk
        status = int(data.split(b" ", 2)[1])
        if status != 101:
            return status, None
        rest = data.split(b"\r\n\r\n", 1)[1]
        while len(rest) < 4:
            chunk = s.recv(65536)
            assert chunk
            rest += chunk
        assert rest[0] == 0x88, rest[:4]  # a close frame first: nothing was streamed
        return status, int.from_bytes(rest[2:4], "big")


async def _read_until_closed(ws: websockets.ClientConnection) -> None:
    while True:
        await asyncio.wait_for(ws.recv(), 30)


async def _close_code(url: str, **kw: object) -> int:
    async with websockets.connect(url, max_size=None, compression=None, **kw) as ws:  # type: ignore[arg-type]
        with pytest.raises(ConnectionClosed) as closed:
            await _read_until_closed(ws)
        assert closed.value.rcvd is not None
        return closed.value.rcvd.code


async def _probe(port: int) -> None:
    url = f"ws://127.0.0.1:{port}/api/stream"
    b64 = base64.urlsafe_b64encode(WRONG.encode()).decode().rstrip("=")
    # wrong tokens: refused with 4401, however they travel
    assert await _close_code(f"{url}?token={quote(WRONG)}") == 4401
    assert await _close_code(url, subprotocols=["blockpool", f"base64url.bearer.{b64}"]) == 4401
    assert await _close_code(f"{url}?ticket={quote(WRONG)}") == 4401
    assert await _close_code(url) == 4401
    # the right token: as a subprotocol (the client's way) ...
    async with StreamClient(url, token=TOKEN) as client:
        await client.wait_until(lambda m: m.seq is not None, timeout=30)
        assert client.replica.counts()["null"] == 1
    # ... and, for old clients, in the query (logged redacted)
    async with websockets.connect(f"{url}?token={TOKEN}", max_size=None) as ws:
        kinds = {p.decode(await asyncio.wait_for(ws.recv(), 30)).kind for _ in range(2)}
        assert kinds == {p.CONFIG, p.SNAPSHOT}
        await ws.send("x" * 5000)  # over ws_max_message_bytes (4096): cut off
        with pytest.raises(ConnectionClosed) as closed:
            await _read_until_closed(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_ws_auth_against_the_real_server(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    proc = start_cli_server(port, log, "--token", TOKEN, env={"BLOCKPOOL_PROTECT_READS": "1"})
    try:
        wrong = WRONG.encode()
        for extra in (
            b"Authorization: Bearer " + WRONG.encode("latin-1", "replace") + b"\r\n",
            b"Authorization: Bearer " + wrong + b"\r\n",
            b"Sec-WebSocket-Protocol: blockpool, bearer." + wrong + b"\r\n",
        ):
            status, code = _raw_handshake(port, extra)
            assert status == 400 or (status == 101 and code == 4401), (status, code)
        asyncio.run(_probe(port))
        # REST: the same check, the same plain refusal
        bad = {"Authorization": b"Bearer " + wrong}
        r = httpx.get(f"http://127.0.0.1:{port}/api/summary", headers=bad)  # type: ignore[arg-type]
        assert r.status_code == 401
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"http://127.0.0.1:{port}/api/summary", headers=good).status_code == 200
    finally:
        stop_cli_server(proc)
    text = log.read_text("utf-8", "replace")
    assert "WebSocket /api/stream?token=[redacted]" in text, text[-3000:]
    assert "Traceback" not in text and "Exception" not in text, text[-3000:]
    assert " 500" not in text, text[-3000:]
    assert TOKEN not in text, "the token reached the log"
    b64 = base64.urlsafe_b64encode(TOKEN.encode()).decode().rstrip("=")
    assert b64 not in text
