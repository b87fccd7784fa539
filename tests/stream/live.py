"""A real uvicorn server in the test's event loop, and state comparisons."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from app.main import create_app
from app.shared.settings import Settings
from app.stream.replica import PoolReplica
from tests.support.ports import free_port


@asynccontextmanager
async def live_server(
    port: int | None = None, paranoid: bool = True, **settings: Any
) -> AsyncIterator[FastAPI]:
    port = port or free_port()
    opts: dict[str, Any] = {"num_blocks": 256, "block_size": 4, "tick_hz": 50.0}
    opts.update(settings)
    app = create_app(Settings(port=port, **opts))
    app.state.engine.paranoid = paranoid  # check_invariants after every operation
    async with serving(app, port):
        yield app


@asynccontextmanager
async def serving(app: FastAPI, port: int | None = None) -> AsyncIterator[FastAPI]:
    """``app`` served by uvicorn on a loopback port (``app.state.port``)."""
    port = port or free_port()
    app.state.port = port
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        ws="websockets-sansio",
        ws_per_message_deflate=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield app
    finally:
        server.should_exit = True
        await task


def ws_url(app: FastAPI) -> str:
    return f"ws://127.0.0.1:{app.state.port}/api/stream"


def http(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.state.port}", timeout=30)


def assert_replica_exact(replica: PoolReplica, app: FastAPI) -> None:
    """The replica holds the pool exactly: ref counts, states, queue order, map."""
    engine = app.state.engine
    pool = engine.pool
    assert replica.seq == app.state.stream.seq
    refs = [0 if b.is_null else b.ref_cnt for b in pool.blocks]
    assert replica.ref_cnt.tolist() == refs
    assert replica.state.tolist() == engine.columns.state.tolist()
    assert replica.queue_order() == [b.block_id for b in pool.free_block_queue]
    truth: dict[tuple[int, int], list[int]] = {}
    for key, blocks in pool.cached_block_hash_to_block.iter_entries():
        k = (int.from_bytes(key[-12:-4], "big"), int.from_bytes(key[-4:], "big"))
        truth[k] = sorted(b.block_id for b in blocks)
    assert replica.hash_map() == truth
    assert replica.counts() == engine.columns.summary()


async def random_traffic(client: httpx.AsyncClient, n: int, seed: int) -> dict[str, int]:
    """Admit / append / finish with shared prefixes, plus raw block ops."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(4, 24))] for _ in range(5)]
    running: list[str] = []
    raw: list[int] = []
    stats = {"ok": 0, "refused": 0}
    for _ in range(n):
        r = rng.random()
        if r < 0.35 or not running:
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 12))]
            resp = await client.post("/api/requests", json={"token_ids": toks})
            if resp.status_code == 201:
                running.append(resp.json()["request_id"])
        elif r < 0.6:
            rid = rng.choice(running)
            toks = [rng.randrange(50) for _ in range(rng.randint(1, 6))]
            resp = await client.post(f"/api/requests/{rid}/tokens", json={"token_ids": toks})
        elif r < 0.8:
            rid = running.pop(rng.randrange(len(running)))
            resp = await client.post(f"/api/requests/{rid}/finish")
        elif r < 0.9:
            resp = await client.post("/api/pool/allocate", json={"num_blocks": rng.randint(1, 3)})
            if resp.status_code == 200:
                raw.extend(resp.json()["block_ids"])
        elif raw:
            rng.shuffle(raw)
            k = rng.randint(1, len(raw))
            ids, raw[:] = raw[:k], raw[k:]
            resp = await client.post("/api/pool/free", json={"block_ids": ids})
        else:
            resp = await client.post("/api/pool/evict", json={"block_ids": [rng.randrange(1, 50)]})
        assert resp.status_code < 500, resp.text
        stats["ok" if resp.status_code < 400 else "refused"] += 1
    for rid in running:
        await client.post(f"/api/requests/{rid}/finish")
    return stats
