"""The costly-read ration cannot be dodged: not by a forged
``X-Forwarded-For`` (ignored unless ``--forwarded-allow-ips``), not by
cycling through 127.0.0.x source addresses (one client) or an IPv6 /64, not
by many clients together (a shared budget), not by exporting the recording
again and again (charged by the bytes it wrote), and one request's story
(a scan of the recording) is rationed too."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.api.costly import client_key
from tests.app.conftest import Api, assert_error, make_app
from tests.app.test_slow_clients import served as served_live

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"
GOOD = {"authorization": f"Bearer {TOKEN}"}
LOOKUP = {"token_ids": list(range(64))}


def client(app: Any, ip: str) -> Api:
    transport = httpx.ASGITransport(app=app, client=(ip, 40000))
    return Api(app, httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000"))


@contextlib.asynccontextmanager
async def served(**settings: Any) -> AsyncIterator[Any]:
    app = make_app(token=TOKEN, costly_reads_per_s=0.001, **settings)
    async with app.router.lifespan_context(app):
        yield app
        app.state.engine.check()


async def lookup(api: Api) -> httpx.Response:
    return await api.post("/api/pool/prefix-lookup", LOOKUP)


def test_client_keys() -> None:
    assert {client_key(f"127.0.0.{i}") for i in range(1, 255)} == {"loopback"}
    assert client_key("127.9.8.7") == client_key("::1") == client_key("::ffff:127.0.0.2")
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff") == "2001:db8::/64"
    assert client_key("2001:db8:0:1::1") != client_key("2001:db8::1")
    assert client_key("10.0.0.1") != client_key("10.0.0.2") and client_key(None) == "unknown"


async def test_cycling_loopback_addresses_is_one_client() -> None:
    async with served(costly_reads_burst=3) as app:
        codes = [(await lookup(client(app, f"127.0.0.{i}"))).status_code for i in range(1, 7)]
        assert codes == [200, 200, 200, 429, 429, 429]
        codes = [(await lookup(client(app, f"2001:db8::{i}"))).status_code for i in range(1, 5)]
        assert codes == [200, 200, 200, 429]


async def test_many_clients_share_one_budget() -> None:
    async with served(costly_reads_burst=4, costly_reads_global_burst=6) as app:
        codes = [(await lookup(client(app, f"10.2.0.{i}"))).status_code for i in range(1, 9)]
        assert codes == [200] * 6 + [429, 429]
        r = await lookup(client(app, "10.2.0.99"))
        err = assert_error(r, 429, "too_many_requests")
        assert "all clients together" in err["message"] and int(r.headers["retry-after"]) >= 1
        # a refusal by the shared budget takes nothing from the client's own
        app.state.costly_global_bucket.burst = 100
        app.state.costly_global_bucket.refund("*", 100)
        codes = [(await lookup(client(app, "10.2.0.99"))).status_code for _ in range(5)]
        assert codes == [200, 200, 200, 200, 429]
        # the token is never rationed
        r = await client(app, "10.2.0.1").post("/api/pool/prefix-lookup", LOOKUP, headers=GOOD)
        assert r.status_code == 200


async def test_the_story_is_rationed() -> None:
    async with served(costly_reads_burst=2) as app:
        api = client(app, "10.3.0.1")
        await api.ok("POST", "/api/requests", {"token_ids": [1, 2, 3], "request_id": "r"}, 201,
                     headers=GOOD)  # fmt: skip
        codes = [(await api.get("/api/requests/r/story")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]


async def test_exports_one_after_another_are_charged_by_their_bytes() -> None:
    async with served(
        costly_reads_burst=8, num_blocks=4096, block_size=16, storage=False, shadow_mode="off"
    ) as app:
        api = client(app, "10.4.0.1")
        ops: list[dict[str, Any]] = []
        for i in range(6):  # 6 x 40,000 token ids recorded: over a MiB of export
            tokens = list(range(i * 100_000, i * 100_000 + 40_000))
            ops += [
                {"op": "admit", "request_id": f"big{i}", "token_ids": tokens},
                {"op": "finish", "request_id": f"big{i}"},
            ]
        await api.ok("POST", "/api/batch", {"ops": ops}, headers=GOOD)
        r = await api.get("/api/history/export")
        assert r.status_code == 200 and len(r.content) > 1024 * 1024
        # half the burst up front, then a unit per MiB written: in debt now
        r = await api.get("/api/history/export")
        err = assert_error(r, 429, "too_many_requests")
        assert err["details"]["retry_after_s"] > 8  # the debt, not just the up-front half
        assert_error(await lookup(api), 429, "too_many_requests")
        # another client is not in this one's debt, the shared budget is
        assert (await lookup(client(app, "10.4.0.2"))).status_code == 200
        assert app.state.costly_global_bucket.take("*", 0.0) == 0.0


def test_a_forged_forwarded_for_is_not_another_client() -> None:
    with served_live(token=TOKEN, costly_reads_burst=2, costly_reads_per_s=0.001) as server:
        codes = []
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for i in range(5):
                r = c.post(
                    "/api/pool/prefix-lookup",
                    json=LOOKUP,
                    headers={"x-forwarded-for": f"203.0.113.{i}"},
                )
                codes.append(r.status_code)
        assert codes == [200, 200, 429, 429, 429]
