"""DNS rebinding reads: a page on a name the attacker controls, rebound to
127.0.0.1, that strips ``Origin`` and ``Referer`` (``referrerPolicy:
'no-referrer'``) and, on plain http, sends no ``Sec-Fetch-*``.  Only its
``Host`` gives it away: every request under a foreign ``Host`` is refused
with 403 ``host_refused`` in the one error shape — the pool service's and
the observer's, reads included — unless ``--allowed-host`` names it."""

from __future__ import annotations

import httpx
import pytest

from app.observer.app import create_observer_app
from app.shared.settings import ObserverSettings
from tests.app.conftest import LiveServer, assert_error, free_port, make_app, raw_answer

pytestmark = pytest.mark.anyio

REBOUND = "rebound.example:8000"
READS = ("/api/summary", "/api/history/export", "/api/config", "/metrics", "/", "/docs")


async def test_bare_reads_under_a_foreign_host_are_refused() -> None:
    app = make_app()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1:8000", timeout=30
        ) as client:
            before = await client.get("/api/summary")
            assert before.status_code == 200
            for path in READS:
                r = await client.get(path, headers={"host": REBOUND})
                err = assert_error(r, 403, "host_refused")
                assert err["details"]["host"] == REBOUND and "--allowed-host" in err["message"]
            r = await client.post(
                "/api/pool/allocate", json={"num_blocks": 1}, headers={"host": REBOUND}
            )
            assert_error(r, 403, "host_refused")
            # the default names still work, with no browser headers at all
            for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost"):
                r = await client.get("/api/summary", headers={"host": host})
                assert r.status_code == 200, (host, r.text)
            assert (await client.get("/api/summary")).json()["counters"] == before.json()[
                "counters"
            ]
        app.state.engine.check()


async def test_allowed_host_lets_a_script_in() -> None:
    app = make_app(allowed_hosts=["box.lan"])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://box.lan:8000") as c:
            assert (await c.get("/api/summary")).status_code == 200
            r = await c.get("/api/summary", headers={"host": "other.lan"})
            assert_error(r, 403, "host_refused")
        app.state.engine.check()


async def test_the_observer_refuses_bare_reads_under_a_foreign_host() -> None:
    app = create_observer_app(ObserverSettings(endpoints=["tcp://127.0.0.1:1"]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
        r = await c.get("/api/health", headers={"host": REBOUND})
        assert_error(r, 403, "host_refused")
        assert (await c.get("/api/health")).status_code == 200


def handshake(port: int, host: str) -> str:
    """The status line the server answers a websocket handshake with."""
    request = (
        f"GET /api/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    )
    answer = raw_answer(port, request.encode(), until=b"\r\n")
    return answer.split(b"\r\n", 1)[0].decode()


def test_a_websocket_under_a_foreign_host_is_refused() -> None:
    with LiveServer(make_app(), free_port()).running() as server:
        assert " 403 " in handshake(server.port, REBOUND)
        assert " 101 " in handshake(server.port, f"127.0.0.1:{server.port}")
