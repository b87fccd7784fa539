"""Slow and idle clients against the server as ``blockpool serve`` runs it
(app/shared/serving.py): a connection that sends nothing, one that drips its
headers a byte at a time, one whose body stalls, one that idles after a
response — each is answered 408 in the one error shape (or closed, when
idle) after its timeout, while the server keeps answering everyone else.
Loopback only; every wait has a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn

from app.shared.serving import uvicorn_config
from tests.app.conftest import LiveServer, free_port, make_app

DEADLINE_S = 60.0  # the whole test's bound (generous: loaded machines)


@contextlib.contextmanager
def served(**settings: Any) -> Iterator[LiveServer]:
    """The app under ``uvicorn_config`` (the CLI's), in a thread."""
    app = make_app(**settings)
    server = LiveServer(app, free_port())
    config = uvicorn_config(app, "127.0.0.1", server.port, "warning", app.state.settings)
    server.server = uvicorn.Server(config)
    with server.running():
        yield server


async def read_until_closed(reader: asyncio.StreamReader, until: float) -> bytes:
    """Everything the server sends until it closes the connection."""
    got = b""
    while time.monotonic() < until:
        try:
            chunk = await asyncio.wait_for(reader.read(4096), 0.5)
        except TimeoutError:
            continue
        except ConnectionError:
            return got
        if not chunk:
            return got
        got += chunk
    raise AssertionError(f"the server kept the connection open; it sent {got!r}")


def error_of(answer: bytes) -> dict[str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    err: dict[str, Any] = json.loads(body)["error"]
    return err


async def silent(port: int, until: float) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await read_until_closed(reader, until)
    finally:
        writer.close()


async def dripping(port: int, until: float) -> bytes:
    """One header byte every 0.2 s, for ever (until the server closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 10_000

    async def drip() -> None:
        for byte in request:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.2)

    task = asyncio.create_task(drip())
    try:
        return await read_until_closed(reader, until)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await task
        writer.close()


async def stalled_body(port: int, until: float) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /api/pool/allocate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"num_'
    )
    await writer.drain()
    try:
        return await read_until_closed(reader, until)
    finally:
        writer.close()


async def idle_after_a_response(port: int, until: float) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    try:
        return await read_until_closed(reader, until)
    finally:
        writer.close()


def test_slow_and_idle_clients_are_cut_off_and_the_server_keeps_serving() -> None:
    limits = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "keep_alive_s": 1}
    with served(**limits) as server:

        async def scenario() -> None:
            until = time.monotonic() + DEADLINE_S
            hostile = [
                *(asyncio.create_task(silent(server.port, until)) for _ in range(20)),
                *(asyncio.create_task(dripping(server.port, until)) for _ in range(20)),
                asyncio.create_task(stalled_body(server.port, until)),
                asyncio.create_task(idle_after_a_response(server.port, until)),
            ]
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                while not all(t.done() for t in hostile):
                    r = await client.get("/api/health")  # everyone else is served
                    assert r.status_code == 200
                    await asyncio.wait(hostile, timeout=0.2)
            answers = [t.result() for t in hostile]
            for answer in answers[:40]:  # no headers in time
                err = error_of(answer)
                assert err["status"] == 408 and err["code"] == "request_timeout", err
            err = error_of(answers[40])  # the body stalled
            assert err["code"] == "body_timeout" and err["details"] == {"timeout_s": 1.0}
            assert answers[41].startswith(b"HTTP/1.1 200 ")  # answered, then closed idle
            assert answers[41].count(b"HTTP/1.1") == 1

        asyncio.run(scenario())
        # the stalled allocation changed nothing
        assert server.engine.pool.get_num_free_blocks() == server.engine.pool.num_gpu_blocks - 1


def test_forwarded_headers_are_ignored_unless_configured() -> None:
    app = make_app()
    config = uvicorn_config(app, "127.0.0.1", 0, "warning", app.state.settings)
    assert config.proxy_headers is False
    app = make_app(forwarded_allow_ips="10.0.0.1")
    config = uvicorn_config(app, "127.0.0.1", 0, "warning", app.state.settings)
    assert config.proxy_headers is True and config.forwarded_allow_ips == "10.0.0.1"
    app.state.engine.check()


def test_connections_over_the_limit_are_refused_in_the_error_shape() -> None:
    with served(max_connections=5, header_timeout_s=60.0) as server:

        async def scenario() -> None:
            until = time.monotonic() + DEADLINE_S
            held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(5)]
            extra = await silent(server.port, until)
            head, _, body = extra.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 "), extra
            err = json.loads(body)["error"]
            assert err["code"] == "too_many_connections" and "5" in err["message"], err
            for _, writer in held:
                writer.close()
            # the slots come back once the server has seen them close
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                while True:
                    try:
                        if (await client.get("/api/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < until, "the slots never came back"
                    await asyncio.sleep(0.05)

        asyncio.run(scenario())
