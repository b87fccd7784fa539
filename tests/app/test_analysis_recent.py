"""GET /api/analysis/recent: the analysis sections' counters, once a second,
so a page's charts start with the server's recent history."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from tests.app.conftest import Api, assert_error, make_app, running

pytestmark = pytest.mark.anyio


@pytest.fixture
async def rapi() -> AsyncIterator[Api]:
    app = make_app(analysis_mode="inline", shadow_mode="off", storage=False)
    app.state.analysis_recent.every_s = 0.0  # a sample at every tick
    async with running(app) as a:
        yield a
        a.check()


async def test_recent_sections_carry_the_counters_in_order(rapi: Api) -> None:
    e = rapi.engine
    await rapi.admit(list(range(100, 118)), request_id="a")  # 4 cold + 1 floor
    e.tick()
    await rapi.finish("a")
    await rapi.admit(list(range(100, 118)), request_id="b")  # 4 hits + 1 floor
    e.tick()
    body = await rapi.ok("GET", "/api/analysis/recent", params={"seconds": 600})
    assert body["enabled"] is True and body["capacity"] == 900
    secs = body["sections"]
    assert len(secs) >= 2
    ts = [s["ts"] for s in secs]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    last = secs[-1]
    assert last["misses"]["cold"] == 4 and last["misses"]["block_size_floor"] == 2
    assert last["hit_blocks"] == 4
    assert last["tokens"]["held"] == 18 and last["tokens"]["tail_waste"] == 2
    first_with_a = next(s for s in secs if s["misses"]["cold"] == 4)
    assert first_with_a["misses"]["block_size_floor"] in (1, 2)
    for a, b in itertools.pairwise(secs):
        assert b["misses"]["cold"] >= a["misses"]["cold"] and b["hit_blocks"] >= a["hit_blocks"]
    misses = await rapi.ok("GET", "/api/misses")
    assert misses["hit"]["blocks"] == last["hit_blocks"]
    # a short span keeps only the newest
    short = await rapi.ok("GET", "/api/analysis/recent", params={"seconds": 1e-9})
    assert len(short["sections"]) == 1 and short["sections"][0]["ts"] >= last["ts"]
    assert_error(await rapi.get("/api/analysis/recent", params={"seconds": 0}), 422)


async def test_recent_is_refused_when_the_analysis_is_off() -> None:
    app = make_app(analysis=False, storage=False)
    async with running(app) as a:
        assert_error(await a.get("/api/analysis/recent"), 409)
        a.check()
