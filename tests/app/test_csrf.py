"""Cross-site requests and DNS rebinding.

A web page the operator visits can make the browser send a body-less POST
to the server; a page whose DNS name is rebound to 127.0.0.1 can even read
the answers.  Refused — token or no token — with 403 and the one error
shape: ``cross_site_refused`` for a mutating request (or websocket) from
another origin, ``host_refused`` for a browser request under a foreign Host
name.  Clients that are not browser pages (no Origin / Referer / Sec-Fetch-*)
are not affected.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from fastapi import FastAPI

from app.cli import parser
from app.cli.settings import settings_from
from app.web.same_origin import SameOriginGuard, host_name, origin_of
from tests.app.conftest import (
    Api,
    LiveServer,
    assert_error,
    free_port,
    make_app,
)

pytestmark = pytest.mark.anyio

BASE = "http://127.0.0.1:8000"  # the server's own origin, as a browser on it sends
EVIL = "https://evil.example"
TOKEN = "s3cret"


@contextlib.asynccontextmanager
async def served(**settings: Any) -> AsyncIterator[Api]:
    app = make_app(**settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE, timeout=30) as client:
            api = Api(app, client)
            yield api
            api.check()


def mutating(app: FastAPI) -> list[tuple[str, str]]:
    out = []
    for template, ops in app.openapi()["paths"].items():
        url = template.replace("{block_id}", "1").replace("{request_id}", "r")
        out.extend((m.upper(), url) for m in ops if m.upper() not in ("GET", "HEAD"))
    return out


async def seed(api: Api, headers: dict[str, str] | None = None) -> None:
    h = headers or {}
    await api.ok("POST", "/api/pool/allocate", {"num_blocks": 2}, headers=h)
    await api.ok(
        "POST", "/api/requests", {"token_ids": list(range(9)), "request_id": "r"}, 201, headers=h
    )


async def test_cross_site_posts_without_a_body_are_refused_and_change_nothing() -> None:
    async with served() as api:
        await seed(api)
        await api.ok("POST", "/api/demo/start")
        assert api.app.state.demo.running_task
        before = api.fingerprint()
        for path in ("/api/pool/reset", "/api/demo/stop", "/api/requests/r/finish"):
            for headers in (
                {"origin": EVIL},
                {"referer": f"{EVIL}/page.html"},
                {"origin": "null"},
                {"sec-fetch-site": "cross-site"},
            ):
                r = await api.client.post(path, headers=headers)
                err = assert_error(r, 403, "cross_site_refused")
                assert "--allowed-origin" in err["message"] or "cross-site" in err["message"]
        assert api.app.state.demo.running_task  # still running: stop was refused
        await api.ok("POST", "/api/demo/stop")
        after = api.fingerprint()
        assert after["requests"] == before["requests"] and after["map"] == before["map"]
        assert "r" in api.engine.manager.requests


async def test_every_mutating_operation_refuses_a_foreign_origin() -> None:
    async with served() as api:
        ops = mutating(api.app)
        assert len(ops) >= 15
        before = api.fingerprint()
        for method, url in ops:
            r = await api.client.request(method, url, json={}, headers={"origin": EVIL})
            assert_error(r, 403, "cross_site_refused")
        assert api.fingerprint() == before


@pytest.mark.parametrize("token", [None, TOKEN])
async def test_own_origin_and_non_browser_clients_are_served(token: str | None) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"} if token else {}
    async with served(token=token) as api:
        # the dashboard's own page (Origin or Referer of this server)
        await seed(api, {"origin": BASE, **auth})
        r = await api.client.post(
            "/api/pool/allocate", json={"num_blocks": 1}, headers={"referer": f"{BASE}/", **auth}
        )
        assert r.status_code == 200, r.text
        r = await api.client.post(
            "/api/pool/allocate",
            json={"num_blocks": 1},
            headers={"origin": BASE, "sec-fetch-site": "same-origin", **auth},
        )
        assert r.status_code == 200, r.text
        # curl / scripts: no Origin, no Referer, no Sec-Fetch-*
        r = await api.client.post("/api/requests/r/finish", headers=auth)
        assert r.status_code == 200, r.text
        # reads from another page are not refused (no CORS header: it cannot read them)
        r = await api.client.get("/api/summary", headers={"origin": EVIL})
        assert r.status_code == 200


async def test_with_the_token_a_cross_site_request_is_still_refused() -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with served(token=TOKEN) as api:
        before = api.fingerprint()
        r = await api.client.post("/api/pool/reset", headers={"origin": EVIL, **auth})
        assert_error(r, 403, "cross_site_refused")
        r = await api.client.post(
            "/api/pool/allocate", json={"num_blocks": 1}, headers={"origin": EVIL, **auth}
        )
        assert_error(r, 403, "cross_site_refused")
        assert api.fingerprint() == before


async def test_dns_rebinding_host_is_refused_for_writes_and_reads() -> None:
    rebound = "evil.example:8000"
    async with served() as api:
        before = api.fingerprint()
        r = await api.client.post(
            "/api/pool/reset", headers={"host": rebound, "origin": f"http://{rebound}"}
        )
        err = assert_error(r, 403, "host_refused")
        assert "--allowed-host" in err["message"]
        # a same-origin GET of the rebound page: no Origin, but Sec-Fetch-*
        for path in ("/api/history/export", "/api/summary", "/", "/docs"):
            r = await api.client.get(
                path,
                headers={
                    "host": rebound,
                    "sec-fetch-site": "same-origin",
                    "sec-fetch-mode": "cors",
                },
            )
            assert_error(r, 403, "host_refused")
        assert api.fingerprint() == before
        # loopback names and IP addresses are this server
        for host in (
            "localhost:8000",
            "127.0.0.1:8000",
            "[::1]:8000",
            "10.1.2.3:8000",
            "app.localhost:8000",
        ):
            r = await api.client.post(
                "/api/pool/allocate",
                json={"num_blocks": 1},
                headers={"host": host, "origin": f"http://{host}"},
            )
            assert r.status_code == 200, (host, r.text)


async def test_allowed_hosts_and_origins_are_settings() -> None:
    async with served(allowed_hosts=["box.lan"], allowed_origins=["https://dash.example"]) as api:
        r = await api.client.post(
            "/api/pool/allocate",
            json={"num_blocks": 1},
            headers={"host": "box.lan:8000", "origin": "http://box.lan:8000"},
        )
        assert r.status_code == 200, r.text
        r = await api.client.post(
            "/api/pool/allocate", json={"num_blocks": 1}, headers={"origin": "https://dash.example"}
        )
        assert r.status_code == 200, r.text
        r = await api.client.post(
            "/api/pool/allocate",
            json={"num_blocks": 1},
            headers={"origin": "https://other.example"},
        )
        assert_error(r, 403, "cross_site_refused")
    args = parser().parse_args(
        [
            "serve",
            "--allowed-host",
            "a.lan",
            "--allowed-host",
            "b.lan",
            "--allowed-origin",
            "https://x.example",
        ]
    )
    s = settings_from(args)
    assert s.allowed_hosts == ["a.lan", "b.lan"] and s.allowed_origins == ["https://x.example"]


async def test_bound_host_name_is_allowed() -> None:
    guard = SameOriginGuard(lambda *a: None, bind_host="myhost.internal")  # type: ignore[arg-type,return-value]  # noqa: ARG005 a stand-in ASGI app
    assert guard.host_ok("myhost.internal:8000") and not guard.host_ok("other.internal")
    wildcard = SameOriginGuard(lambda *a: None, bind_host="0.0.0.0")  # type: ignore[arg-type,return-value]  # noqa: ARG005 a stand-in ASGI app
    assert wildcard.host_ok("192.168.1.9:8000") and not wildcard.host_ok("0.0.0.0.evil.example")
    anyhost = SameOriginGuard(lambda *a: None, bind_host="127.0.0.1", allowed_hosts=["*"])  # type: ignore[arg-type,return-value]  # noqa: ARG005 a stand-in ASGI app
    assert anyhost.host_ok("whatever.example")


def test_origin_and_host_parsing() -> None:
    assert origin_of("http://127.0.0.1:8000/x?y") == "http://127.0.0.1:8000"
    assert origin_of("https://Example.COM:443/") == "https://example.com"
    assert origin_of("http://[::1]:80/") == "http://[::1]"
    assert origin_of("not a url") is None and origin_of("http://:99999/") is None
    assert host_name("[::1]:8000") == "::1" and host_name("Box.LAN:80") == "box.lan"
    assert host_name("::1") == "::1" and host_name("localhost") == "localhost"


def test_a_cross_site_websocket_handshake_is_refused() -> None:
    import asyncio

    server = LiveServer(make_app(), free_port())
    server.start()
    url = f"ws://127.0.0.1:{server.port}/api/stream"
    try:

        async def attempt(origin: str | None) -> str:
            kw: dict[str, Any] = {"origin": origin} if origin else {}
            try:
                async with websockets.connect(url, open_timeout=20, **kw) as ws:
                    await ws.recv()
                    return "open"
            except websockets.InvalidStatus as exc:
                return f"refused {exc.response.status_code}"

        assert asyncio.run(attempt(EVIL)) == "refused 403"
        assert asyncio.run(attempt(f"http://127.0.0.1:{server.port}")) == "open"
        assert asyncio.run(attempt(None)) == "open"
        server.call(server.engine.check)
    finally:
        server.stop()


async def test_the_observer_refuses_cross_site_and_rebinding_too() -> None:
    from app.observer.app import create_observer_app
    from app.shared.settings import ObserverSettings

    app = create_observer_app(ObserverSettings(endpoints=["tcp://127.0.0.1:1"]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        r = await client.post("/api/fleet/prefixes", json={}, headers={"origin": EVIL})
        assert_error(r, 403, "cross_site_refused")
        r = await client.get(
            "/api/fleet", headers={"host": "evil.example", "sec-fetch-site": "same-origin"}
        )
        assert_error(r, 403, "host_refused")
    args = parser().parse_args(["observe", "tcp://127.0.0.1:1", "--allowed-host", "box.lan"])
    from app.cli.settings import observer_settings_from

    assert observer_settings_from(args).allowed_hosts == ["box.lan"]
