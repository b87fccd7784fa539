"""Costly reads with a token set: reads stay open, but
those that cost O(pool) or more per call are rationed for a client without
the token — a burst, then a refill rate per client address; beyond it 429
``too_many_requests`` with Retry-After, nothing changed.  With the token, or
on a server without one, they are not limited."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.api.costly import Buckets
from tests.app.conftest import Api, assert_error, make_app

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"
GOOD = {"authorization": f"Bearer {TOKEN}"}
BIG_PROMPT = {"token_ids": list(range(4096))}
# every costly read: (method, url, body)
COSTLY: list[tuple[str, str, Any]] = [
    ("POST", "/api/pool/prefix-lookup", BIG_PROMPT),
    ("POST", "/api/requests/r/verify", None),
    ("GET", "/api/queue?offset=10", None),
    ("GET", "/api/hashmap?hash=ab", None),
    ("GET", "/api/prefix-tree", None),
    ("GET", "/api/history/state?at=1", None),
    ("GET", "/api/history/diff?from=1&to=2", None),
    ("GET", "/api/history/export", None),
    ("GET", "/api/requests/r/story", None),
    ("GET", "/api/history/export.jsonl.gz", None),
]
# the export's size is read from counters: never rationed
SIZE = ("GET", "/api/history/export/size", None)


@contextlib.asynccontextmanager
async def served(client_ip: str = "10.0.0.1", **settings: Any) -> AsyncIterator[Api]:
    app = make_app(analysis_mode="inline", shadow_mode="inline", **settings)
    async with app.router.lifespan_context(app):
        yield _api(app, client_ip)


def _api(app: Any, client_ip: str) -> Api:
    transport = httpx.ASGITransport(app=app, client=(client_ip, 40000))
    return Api(app, httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000"))


async def _seed(api: Api) -> None:
    await api.ok("POST", "/api/requests", {"token_ids": list(range(9)), "request_id": "r"}, 201,
                 headers=GOOD)  # fmt: skip


async def _call(api: Api, method: str, url: str, body: Any, **kw: Any) -> httpx.Response:
    return await api.client.request(method, url, json=body, **kw)


async def test_exactly_the_costly_reads_are_rationed() -> None:
    """Over the whole schema: every read called three times by a fresh client
    with a ration of two units; the third call is 429 for the costly reads only."""
    async with served(
        token=TOKEN, costly_reads_burst=2, costly_reads_per_s=0.001, costly_reads_global_burst=10**6
    ) as api:
        await _seed(api)
        rationed = set()
        reads = [
            (m.upper(), t)
            for t, ops in api.app.openapi()["paths"].items()
            for m in ops
            if m == "get" or t in ("/api/pool/prefix-lookup", "/api/requests/{request_id}/verify")
        ]
        assert len(reads) >= 25
        for i, (method, template) in enumerate(reads):
            client = _api(api.app, f"10.1.0.{i + 1}")
            url = template.replace("{block_id}", "1").replace("{request_id}", "r")
            body = BIG_PROMPT if method == "POST" else None
            for _ in range(2):
                assert (await _call(client, method, url, body)).status_code != 429
            if (await _call(client, method, url, body)).status_code == 429:
                rationed.add(template)
        listed = {url.split("?")[0].replace("/r/", "/{request_id}/") for _, url, _ in COSTLY}
        assert rationed == listed
        api.check()


async def test_a_client_without_the_token_gets_a_ration_then_429() -> None:
    cheap = [c for c in COSTLY if not c[1].startswith("/api/history/export")]
    export = next(c for c in COSTLY if c[1] == "/api/history/export")
    size = SIZE
    async with served(token=TOKEN, costly_reads_burst=len(cheap), costly_reads_per_s=0.001) as api:
        await _seed(api)
        before = api.fingerprint()
        for method, url, body in cheap:  # the burst: each once, a unit each
            r = await _call(api, method, url, body)
            assert r.status_code not in (401, 403, 429), (url, r.text)
        for method, url, body in COSTLY:  # the ration is spent: every one is refused
            r = await _call(api, method, url, body)
            err = assert_error(r, 429, "too_many_requests")
            assert int(r.headers["retry-after"]) >= 1 and "Bearer" in err["message"]
            assert err["details"]["retry_after_s"] == int(r.headers["retry-after"])
        # with the token: not limited
        for _ in range(3):
            for method, url, body in COSTLY:
                r = await _call(api, method, url, body, headers=GOOD)
                assert r.status_code != 429, (url, r.text)
        # another client has its own ration; an export takes half of it, the
        # export's size nothing (however often it is asked)
        other = _api(api.app, "10.0.0.2")
        for call in (size, export, size, size, export, size):
            r = await _call(other, *call)
            assert r.status_code == 200, r.text
        assert_error(await _call(other, *COSTLY[0]), 429, "too_many_requests")
        # a big body costs more: after two small lookups, a 262,144-token one
        # (~1.8 MB: 1 + 7 units, more than the 5 left) is refused
        third = _api(api.app, "10.0.0.3")
        for _ in range(2):
            assert (await _call(third, *COSTLY[0])).status_code == 200
        r = await _call(third, "POST", COSTLY[0][1], {"token_ids": list(range(262_144))})
        assert_error(r, 429, "too_many_requests")
        assert (await _call(third, *COSTLY[0])).status_code == 200  # a small one still fits
        # cheap reads are never rationed
        for _ in range(20):
            assert (await api.get("/api/summary")).status_code == 200
        assert api.fingerprint() == before
        api.check()


async def test_without_a_server_token_costly_reads_are_not_rationed() -> None:
    async with served(costly_reads_burst=1, costly_reads_per_s=0.001) as api:
        for _ in range(5):
            r = await _call(api, *COSTLY[0])
            assert r.status_code == 200, r.text
        api.check()


async def test_protected_reads_still_answer_401_first() -> None:
    async with served(token=TOKEN, protect_reads=True, costly_reads_burst=1) as api:
        for _ in range(3):  # a refused call takes nothing from the ration
            r = await _call(api, *COSTLY[0])
            assert_error(r, 401, "unauthorized")
        r = await api.client.post("/api/pool/prefix-lookup", content=b"{oops",
                                  headers={"content-type": "application/json"})  # fmt: skip
        assert_error(r, 401, "unauthorized")
        r = await _call(api, *COSTLY[0], headers=GOOD)
        assert r.status_code == 200
        api.check()


def test_buckets_refill_at_their_rate() -> None:
    now = [100.0]
    b = Buckets(burst=3, per_s=2.0, clock=lambda: now[0])
    assert [b.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take("a") == pytest.approx(0.5)  # one call back in 1/2 s
    assert b.take("b") == 0.0  # per client
    now[0] += 0.5
    assert b.take("a") == 0.0 and b.take("a") > 0
    now[0] += 100  # refills up to the burst, no further
    assert [b.take("a") for _ in range(4)][:3] == [0.0, 0.0, 0.0] and b.refused == 3
    now[0] += 100
    assert b.take("c", cost=2.0) == 0.0 and b.take("c", cost=2.0) == pytest.approx(0.5)
    assert b.take("d", cost=99.0) == 0.0  # a cost over the burst takes a full bucket
    assert b.take("d") == pytest.approx(0.5)
