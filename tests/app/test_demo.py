"""The demo workload: configure, start (requests flow, the pool fills, prefixes
are shared), stop (its requests finish: nothing held)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.app.conftest import Api
from tests.support.wait import eventually_async

pytestmark = pytest.mark.anyio

# A small pool of 16-token blocks: the demo's prompts (150..2500 tokens) fill it.
DEMO = {"num_blocks": 256, "block_size": 16}


async def wait_for(api: Api, pred: Any, timeout: float = 60.0) -> dict[str, Any]:
    async def seen() -> dict[str, Any] | None:
        s = await api.summary()
        return s if pred(s) else None

    found: dict[str, Any] = await eventually_async(seen, timeout, "the summary to match")
    return found


@pytest.mark.app_settings(**DEMO)
async def test_demo_runs_fills_the_pool_and_stops_clean(api: Api) -> None:
    status = await api.ok("GET", "/api/demo")
    assert status["running"] is False and status["stats"]["arrived"] == 0
    cfg = await api.ok(
        "POST",
        "/api/demo/config",
        {
            "rate": 60,
            "decode_tokens": [8, 24],
            "max_running": 12,
            "mix": {"chat": 3, "document": 1},
        },
    )
    assert cfg["rate"] == 60 and cfg["decode_tokens"] == [8, 24] and cfg["max_running"] == 12
    assert cfg["mix"] == {"chat": 3.0, "conversation": 0.0, "document": 1.0, "noise": 0.0}
    assert cfg["running"] is False

    started = await api.ok("POST", "/api/demo/start")
    assert started["running"] is True
    assert (await api.ok("POST", "/api/demo/start"))["running"] is True  # idempotent

    peak_usage = 0.0

    def busy(s: dict[str, Any]) -> bool:
        nonlocal peak_usage
        peak_usage = max(peak_usage, s["usage"])
        c = s["counters"]
        return (
            c["requests_finished"] >= 20
            and s["prefix_cache"]["hits_tokens"] > 0
            and peak_usage > 0.5
        )

    s = await wait_for(api, busy)
    api.check()  # consistent while running (the test runs between engine steps)
    assert s["counters"]["blocks_cached"] > 0
    status = await api.ok("GET", "/api/demo")
    st = status["stats"]
    assert st["arrived"] >= st["admitted"] >= st["finished"] >= 20
    assert status["requests_running"] <= 12
    assert status["requests_running"] == len(api.app.state.demo.running)
    running = await api.ok("GET", "/api/requests")
    assert all(i["request_id"].startswith("demo-") for i in running["items"])
    m = (await api.get("/metrics")).text
    assert "blockpool_demo_requests_arrived_total" in m
    assert "blockpool_demo_running 1.0" in m

    stopped = await api.ok("POST", "/api/demo/stop")
    assert stopped["running"] is False
    assert stopped["requests_running"] == 0 and stopped["requests_waiting"] == 0
    s = await api.summary()
    assert s["running_requests"] == 0
    assert s["blocks"]["in_use"] == 0
    assert s["num_free_blocks"] == 255
    assert s["counters"]["requests_finished"] == s["counters"]["requests_admitted"]
    assert s["blocks"]["cached"] > 0  # the cache outlives the requests
    api.check()
    # stopped means stopped: nothing moves any more
    ops = api.engine.counters.ops
    await asyncio.sleep(0.2)
    assert api.engine.counters.ops == ops
    assert (await api.ok("POST", "/api/demo/stop"))["running"] is False


@pytest.mark.app_settings(**DEMO, demo=True, demo_rate=50)
async def test_demo_setting_starts_it_with_the_app(api: Api) -> None:
    assert (await api.ok("GET", "/api/demo"))["running"] is True
    await wait_for(api, lambda s: s["counters"]["requests_admitted"] >= 3)
    await api.ok("POST", "/api/demo/stop")
    s = await api.summary()
    assert s["blocks"]["in_use"] == 0 and s["running_requests"] == 0
    api.check()


@pytest.mark.app_settings(**DEMO)
async def test_demo_and_clients_share_the_pool(api: Api) -> None:
    """The demo drives the same engine as REST clients; the reset is refused
    while it holds blocks and succeeds once it has stopped."""
    held = await api.allocate(10)
    await api.ok("POST", "/api/demo/config", {"rate": 40, "decode_tokens": [4, 8]})
    await api.ok("POST", "/api/demo/start")
    await wait_for(api, lambda s: s["running_requests"] > 0)
    r = await api.post("/api/pool/reset")
    assert r.status_code == 409 and r.json()["error"]["code"] == "reset_refused"
    await api.ok("POST", "/api/demo/stop")
    assert [b.ref_cnt for b in api.engine.pool.blocks[1:11]] == [1] * 10
    await api.free(held)
    assert await api.ok("POST", "/api/pool/reset") == {"reset": True}
    s = await api.summary()
    assert s["blocks"] == {"null": 1, "in_use": 0, "cached": 0, "empty": 255}
    api.check()


@pytest.mark.app_settings(**DEMO)
async def test_demo_config_partial_updates(api: Api) -> None:
    base = await api.ok("GET", "/api/demo")
    after = await api.ok("POST", "/api/demo/config", {})
    assert after == base
    after = await api.ok("POST", "/api/demo/config", {"max_running": 5})
    assert after["max_running"] == 5 and after["rate"] == base["rate"]
    after = await api.ok("POST", "/api/demo/config", {"rate": 0})
    assert after["rate"] == 0 and after["max_running"] == 5


def test_the_default_demo_holds_steady_on_a_busy_machine() -> None:
    """Steps that come 8x late (a loaded machine) decode 8x the tokens: the
    default load (rate, mix, decode lengths) keeps running and waiting far
    below their caps for 5 simulated minutes, and drops nothing."""
    from app.pool.demo import MAX_CATCH_UP, STEP_S, DemoWorkload
    from app.pool.engine import Engine
    from app.shared.settings import Settings

    engine = Engine(Settings(analysis_mode="inline", shadow_mode="off", storage=False))
    engine.paranoid = False
    demo = DemoWorkload(engine)  # the defaults
    late = STEP_S * MAX_CATCH_UP
    assert demo.step_tokens(STEP_S) == demo.decode_per_step
    assert demo.step_tokens(late) == demo.decode_per_step * MAX_CATCH_UP
    assert demo.step_tokens(10 * late) == demo.decode_per_step * MAX_CATCH_UP  # bounded
    peak_running = peak_waiting = 0
    for i in range(int(300 / late)):
        demo.arrive(late)
        demo._step(demo.step_tokens(late))
        if i % 5 == 0:
            engine.tick()
        peak_running = max(peak_running, len(demo.running))
        peak_waiting = max(peak_waiting, len(demo.waiting))
    assert demo.stats.arrived > 0.8 * demo.rate * 300
    assert demo.stats.dropped_waiting == 0
    assert peak_running < demo.max_running // 2, peak_running
    assert peak_waiting < 32, peak_waiting
    assert demo.stats.finished > 0.8 * demo.stats.arrived
    for rid, req in list(demo.running.items()):
        demo._finish(rid, req)
    engine.check()
