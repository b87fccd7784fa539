"""Fixtures for the service tests: an app over ASGI with its lifespan running.

``api`` is the workhorse: a small pool (64 blocks of 4 tokens), the engine in
paranoid mode (check_invariants after every operation), an httpx client over
ASGI, and helpers to fingerprint the whole state.  Settings for one test go
in ``@pytest.mark.app_settings(...)``.  On teardown every ``api`` fixture runs
``engine.check()`` (pool invariants + engine bookkeeping).

``live_server`` runs a real uvicorn server on a free port in a thread, for
tests that need real sockets (concurrency from threads, chunked uploads).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

import blockpool
from app.main import create_app
from app.pool.engine import Engine
from app.shared.settings import Settings
from tests.conftest import FIXED_SEED, map_contents
from tests.support.ports import free_port

SMALL: dict[str, Any] = {
    "num_blocks": 64,
    "block_size": 4,
    "hash_fn": "sha256",
    "hash_seed": FIXED_SEED,
    "host": "127.0.0.1",
}
ERROR_KEYS = {"status", "code", "message", "details"}
# Tallies of refused operations: a refused call moves these and nothing else.
REFUSAL_COUNTERS = {"ops", "ops_failed", "resets_refused", "requests_refused"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "app_settings(**kw): Settings overrides for the api / live_server fixtures"
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings read BLOCKPOOL_* from the environment: keep tests hermetic,
    and put the library's NONE_HASH back (the engine sets it globally)."""
    for key in list(os.environ):
        if key.startswith("BLOCKPOOL_"):
            monkeypatch.delenv(key)
    yield
    blockpool.init_none_hash(blockpool.sha256, seed=FIXED_SEED)


def make_settings(**overrides: Any) -> Settings:
    return Settings(**{**SMALL, **overrides})


def make_app(**overrides: Any) -> FastAPI:
    app = create_app(make_settings(**overrides))
    app.state.engine.paranoid = True
    return app


def assert_error(
    response: httpx.Response, status: int, code: str | None = None, *, contains: str = ""
) -> dict[str, Any]:
    """The one error shape, with the given status (and code); returns ``error``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == ERROR_KEYS, err
    assert err["status"] == status
    assert isinstance(err["code"], str) and err["code"]
    assert isinstance(err["message"], str) and len(err["message"]) > 5
    assert isinstance(err["details"], dict)
    if code is not None:
        assert err["code"] == code, err
    if contains:
        assert contains in err["message"], err["message"]
    return err  # type: ignore[no-any-return]


def fingerprint(engine: Engine) -> dict[str, Any]:
    """Everything a refused call must leave as it was."""
    pool = engine.pool
    cols = engine.columns
    counters = dataclasses.asdict(engine.counters)
    for key in REFUSAL_COUNTERS:
        counters.pop(key)
    stats = engine.manager.stats
    mc = engine.collector
    return {
        "blocks": [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks],
        "queue": [b.block_id for b in pool.free_block_queue],
        "num_free": pool.get_num_free_blocks(),
        "map": map_contents(pool),
        "raw_refs": engine.raw_refs.tolist(),
        "requests": {
            rid: (m.num_tokens, m.block_ids(), m.num_cached_blocks, m.num_hit_blocks)
            for rid, m in engine.manager.requests.items()
        },
        "columns": (
            cols.state.tolist(),
            cols.ref_cnt.tolist(),
            cols.hashed.tolist(),
            cols.stamp.tolist(),
            list(cols.counts),
        ),
        "events": (engine.events.last_seq, engine.events.dropped),
        "samples": engine.samples.last_seq,
        "counters": counters,
        "stats": (stats.requests, stats.queries, stats.hits),
        "sampled": {
            b: (s.birth_time_ns, tuple(s.access_history)) for b, s in mc.block_metrics.items()
        },
    }


class Api:
    """An httpx client on the app, plus the engine and state helpers."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client
        self.engine: Engine = app.state.engine

    async def get(self, url: str, **kw: Any) -> httpx.Response:
        return await self.client.get(url, **kw)

    async def post(self, url: str, json: Any = None, **kw: Any) -> httpx.Response:
        if json is not None:
            kw["json"] = json
        return await self.client.post(url, **kw)

    async def ok(
        self, method: str, url: str, json: Any = None, status: int = 200, **kw: Any
    ) -> Any:
        if json is not None:
            kw["json"] = json
        r = await self.client.request(method, url, **kw)
        assert r.status_code == status, f"{method} {url}: {r.status_code} {r.text}"
        return r.json()

    async def allocate(self, n: int) -> list[int]:
        body = await self.ok("POST", "/api/pool/allocate", {"num_blocks": n})
        return body["block_ids"]  # type: ignore[no-any-return]

    async def free(self, ids: list[int]) -> dict[str, Any]:
        return await self.ok("POST", "/api/pool/free", {"block_ids": ids})  # type: ignore[no-any-return]

    async def cache(self, ids: list[int], tokens: list[int], **extra: Any) -> list[str]:
        body = await self.ok(
            "POST", "/api/pool/cache", {"block_ids": ids, "token_ids": tokens, **extra}
        )
        return body["block_hashes"]  # type: ignore[no-any-return]

    async def admit(self, tokens: list[int], **extra: Any) -> dict[str, Any]:
        return await self.ok(  # type: ignore[no-any-return]
            "POST", "/api/requests", {"token_ids": tokens, **extra}, status=201
        )

    async def finish(self, rid: str) -> dict[str, Any]:
        return await self.ok("POST", f"/api/requests/{rid}/finish")  # type: ignore[no-any-return]

    async def queue(self) -> list[int]:
        body = await self.ok("GET", "/api/queue", params={"limit": 10_000})
        assert body["total"] == len(body["items"])
        return [item["block_id"] for item in body["items"]]

    async def summary(self) -> dict[str, Any]:
        return await self.ok("GET", "/api/summary")  # type: ignore[no-any-return]

    async def events(self, since: int = 0, **params: Any) -> list[dict[str, Any]]:
        body = await self.ok("GET", "/api/events", params={"since": since, **params})
        return body["items"]  # type: ignore[no-any-return]

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint(self.engine)

    def check(self) -> None:
        self.engine.check()

    def pool_queue(self) -> list[int]:
        return [b.block_id for b in self.engine.pool.free_block_queue]


@contextlib.asynccontextmanager
async def running(app: FastAPI, **client_kw: Any) -> AsyncIterator[Api]:
    """The app's lifespan (engine started) and a client over ASGI."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1:8000", timeout=30, **client_kw
        ) as client:
            yield Api(app, client)


def _marked(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("app_settings")
    return dict(marker.kwargs) if marker else {}


@pytest.fixture
async def api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    app = make_app(**_marked(request))
    async with running(app) as a:
        yield a
        a.check()
    app.state.engine.check()


# ------------------------------------------------------------ a real server


class LiveServer:
    """uvicorn in a thread (its own event loop); ``url`` is its base URL."""

    def __init__(self, app: FastAPI, port: int) -> None:
        self.app = app
        self.engine: Engine = app.state.engine
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name="uvicorn-test", daemon=True)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        try:
            loop.run_until_complete(self.server.serve())
        finally:
            loop.close()

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the server's loop between operations (e.g. engine.check)."""
        assert self.loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        assert not self.thread.is_alive(), "uvicorn did not stop"

    @contextlib.contextmanager
    def running(self) -> Iterator[LiveServer]:
        """Started for the block; its engine's invariants checked at the end."""
        self.start()
        try:
            yield self
            self.call(self.engine.check)
        finally:
            self.stop()


def raw_answer(port: int, request: bytes, until: bytes = b"\r\n\r\n") -> bytes:
    """Send raw bytes to a loopback server; its answer up to ``until`` (or
    to the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while until not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


@pytest.fixture
def live_server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    app = make_app(**_marked(request))
    with LiveServer(app, free_port()).running() as server:
        yield server
