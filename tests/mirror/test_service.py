"""``serve --mirror``: the service follows an engine over ZMQ, read only, exact.

The engine is a blockpool runtime followed exactly as the plugin follows
vLLM's pool (tests/mirror/workload.py), its batches sent by the plugin's own
sender thread; the service is the real app with the mirror installed
(tests/mirror/rig.py).  The request story, the analysis and the page's
stream of a mirror have their own files.
"""

from __future__ import annotations

import anyio
import pytest

from app.main import create_app
from app.mirror import setup as mirror_setup
from app.mirror import status as mirror_status
from blockpool.mirror import pool_digest
from blockpool.mirror import protocol as wire
from blockpool.mirror.protocol import DigestReading
from tests.app.conftest import assert_error, free_port, make_settings, running
from tests.mirror.rig import Rig, metric, until

pytestmark = pytest.mark.anyio


async def test_the_service_mirrors_the_engine_exactly_and_read_only(rig: Rig) -> None:
    engine = rig.engine
    engine.drive(20)  # a start mid-run: the mirror begins from a snapshot
    hello = await rig.hello()
    assert hello.num_gpu_blocks == 64 and hello.free_order == engine.free_order
    settings = mirror_setup.settings_for(hello, make_settings(demo=True))
    assert not settings.demo and settings.free_order == engine.free_order
    app = create_app(settings)
    control = mirror_setup.control_for(rig.endpoint, hello)
    client = mirror_setup.install(app, rig.endpoint, control, rig.mirror_key, hello)
    mine = app.state.engine

    async with running(app) as api:
        await rig.drive(client, 40, 5)
        await until(lambda: client.status.digests_checked > 3)
        assert pool_digest(mine.pool) == pool_digest(engine.rt.pool)
        mine.check()

        # every view reads the mirrored pool: the LRU queue in eviction order
        q = await api.ok("GET", "/api/queue", params={"limit": 10000})
        assert [i["block_id"] for i in q["items"]] == [
            b.block_id for b in engine.rt.pool.free_block_queue
        ]
        # the engine's prefix-cache counters, as /metrics exports them
        text = (await api.get("/metrics")).text
        stats = engine.rt.manager.stats
        assert metric(text, "blockpool_engine_prefix_cache_hits_total") == stats.hits > 0
        assert metric(text, "blockpool_engine_prefix_cache_queries_total") == stats.queries

        st = await api.ok("GET", "/api/mirror")
        assert st["connected"] and st["exact"] and st["synced"] and not st["stale"]
        # every answer says it comes from a mirror (the dashboard shows its item then)
        assert (await api.get("/api/config")).headers["x-blockpool-mirror"] == "1"
        assert st["divergences"] == 0 and st["gaps"] == 0 and st["resyncs"] == 0
        assert st["syncs"] == 1  # the first sync is no resync
        assert st["ops_applied"] > 100 and st["lag_ms"] is not None
        assert st["engine"]["engine_id"] == "test-engine"
        assert st["engine"]["free_order"] == engine.free_order

        # read only: a mutation is refused and changes nothing
        before = pool_digest(mine.pool)
        r = await api.post("/api/pool/allocate", json={"num_blocks": 1})
        assert_error(r, 409, "read_only_mirror")
        r = await api.post("/api/requests", json={"token_ids": [1, 2, 3]})
        assert_error(r, 409, "read_only_mirror")
        assert pool_digest(mine.pool) == before
        # a lookup changes nothing and stays open
        r = await api.post("/api/pool/prefix-lookup", json={"token_ids": [1, 2, 3, 4, 5]})
        assert r.status_code == 200

        # a dropped batch: the mirror sees the gap and resyncs from a snapshot
        engine.accept = False
        engine.drive(3)
        engine.accept = True
        engine.drive(10)
        await until(lambda: client.status.gaps >= 1 and client.status.resyncs >= 1)
        await until(lambda: rig.caught_up(client))
        assert pool_digest(mine.pool) == pool_digest(engine.rt.pool)
        engine.drive(3)  # exact again once a digest of the engine's matched since the resync
        await until(lambda: client.status.digests_checked_since_sync > 0 and rig.caught_up(client))
        st = await api.ok("GET", "/api/mirror")
        assert st["engine_drops"] >= 1 and st["exact"]
        mine.check()

        # the engine's requests, hashes and lengths only
        reqs = await api.ok("GET", "/api/mirror/requests")
        assert reqs["known"] == 0  # this engine (the runtime) reports no request records

    engine.rt.check()


async def test_a_silent_engine_is_stale(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirror_status, "STALE_AFTER_S", 2.0)
    hello = await rig.hello()
    app, client = rig.service(hello)
    async with running(app) as api:
        rig.engine.drive(5)
        await until(lambda: client.applier.synced and not client.status.stale)
        assert client.status.as_dict()["connected"]
        rig.close()  # the engine is gone
        await until(lambda: client.status.stale, timeout=30)
        st = await api.ok("GET", "/api/mirror")
        assert not st["connected"] and st["stale"] and not st["exact"]
    app.state.engine.check()


async def test_no_engine_no_service() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(mirror_setup.MirrorStartError, match="no handshake"):
        await anyio.to_thread.run_sync(mirror_setup.wait_hello, endpoint, 0.5)
    with pytest.raises(mirror_setup.MirrorStartError, match="tcp://HOST:PORT"):
        mirror_setup.check_endpoint("ipc:///tmp/x")


async def test_a_service_without_mirror_says_so() -> None:
    app = create_app(make_settings())
    async with running(app) as api:
        assert_error(await api.get("/api/mirror"), 404, "not_found")
        assert "x-blockpool-mirror" not in (await api.get("/api/config")).headers


async def test_an_engine_the_mirror_cannot_follow_is_never_called_exact(rig: Rig) -> None:
    rig.engine.problems = ["2 KV-cache groups (hybrid models): the mirror follows one"]
    hello = await rig.hello_saying(lambda h: not h.exact)
    assert not hello.exact
    app = create_app(mirror_setup.settings_for(hello, make_settings()))
    control = mirror_setup.control_for(rig.endpoint, hello)
    client = mirror_setup.install(app, rig.endpoint, control, rig.mirror_key, hello)
    async with running(app) as api:
        await until(lambda: client.applier.synced)
        for _ in range(10):
            rig.engine.drive(3)
            await anyio.sleep(0)
        await until(lambda: client.status.digests_checked >= 2)
        st = await api.ok("GET", "/api/mirror")
        assert st["connected"] and st["synced"] and not st["exact"]
        assert st["engine"]["problems"] == rig.engine.problems
    app.state.engine.check()


async def test_the_metrics_carry_the_engines_model_name(rig: Rig) -> None:
    rig.engine.model = "tiny-llama"
    hello = await rig.hello_saying(lambda h: h.model == "tiny-llama")
    assert hello.model == "tiny-llama"
    assert mirror_setup.settings_for(hello, make_settings()).model_name == "tiny-llama"
    # an engine that names no model: "vllm-mirror"; a --model-name given stays
    hello.model = None
    assert mirror_setup.settings_for(hello, make_settings()).model_name == "vllm-mirror"
    assert mirror_setup.settings_for(hello, make_settings(model_name="m")).model_name == "m"
    hello.model = "tiny-llama"
    app = create_app(mirror_setup.settings_for(hello, make_settings()))
    control = mirror_setup.control_for(rig.endpoint, hello)
    client = mirror_setup.install(app, rig.endpoint, control, rig.mirror_key, hello)
    async with running(app) as api:
        rig.engine.drive(5)
        await until(lambda: client.applier.synced)
        text = (await api.get("/metrics")).text
        name = "blockpool_engine_prefix_cache_queries_total{"
        samples = [x for x in text.splitlines() if x.startswith(name)]
        assert samples and all('model_name="tiny-llama"' in x for x in samples)
        cfg = await api.ok("GET", "/api/config")
        assert cfg["model_name"] == "tiny-llama"
    app.state.engine.check()


async def test_the_plugins_time_per_step_is_shown_as_quantiles(rig: Rig) -> None:
    """The beat's p50, p99 and max of the follower's time per step (µs), on
    /api/mirror and /metrics; not known (null, no series) before a beat."""
    hello = await rig.hello()
    app, client = rig.service(hello)
    async with running(app) as api:
        st = await api.ok("GET", "/api/mirror")
        if client.status.engine_cost_us is None:
            assert st["plugin_step_us"] is None
            with pytest.raises(AssertionError, match="no blockpool_mirror_plugin"):
                metric((await api.get("/metrics")).text, "blockpool_mirror_plugin_step_max_us")
        await rig.drive(client, 5, 4)
        await until(lambda: client.status.engine_cost_us is not None)  # a beat, when idle
        st = await api.ok("GET", "/api/mirror")
        q = st["plugin_step_us"]
        want = rig.engine.follower.cost_quantiles()
        assert want is not None and q is not None
        assert 0 < q["p50"] <= q["p99"] <= q["max"] <= want[2]
        text = (await api.get("/metrics")).text
        assert metric(text, "blockpool_mirror_plugin_step_max_us") == q["max"]
    app.state.engine.check()


async def test_how_far_the_engines_digest_is_behind_is_shown(rig: Rig) -> None:
    """What the plugin says of its digest (an engine that never waits for its
    forward passes gives its thread no time to read: thousands of blocks
    behind, passes of 35 µs) on /api/mirror and /metrics -- not known (null,
    no series) before the engine said it; then a beat says the digest caught up."""
    hello = await rig.hello()
    app, client = rig.service(hello)
    async with running(app) as api:
        st = await api.ok("GET", "/api/mirror")
        assert st["plugin_digest"] is None
        with pytest.raises(AssertionError, match="no blockpool_mirror_plugin_digest"):
            metric((await api.get("/metrics")).text, "blockpool_mirror_plugin_digest_behind_blocks")
        starved = DigestReading(
            behind=4321,
            sweep_left=None,
            window_us=35.0,
            taken=0,
            discarded=17,
            stopped=5,
            overrun=3,
            planned_too_long=2,
        )
        rig.reading = starved
        await until(lambda: client.status.engine_reading == starved)  # the next handshake
        st = await api.ok("GET", "/api/mirror")
        assert st["plugin_digest"] == {
            "behind_blocks": 4321,
            "sweep_rows_left": None,
            "forward_pass_ms": 0.035,
            "digests_taken": 0,
            "readings_discarded": 17,
            "readings_stopped": 5,
            "readings_overrun": 3,
            "plans_too_long": 2,
        }
        assert st["state"] != "exact"  # no digest matched: "verifying", with the reason shown
        text = (await api.get("/metrics")).text
        assert metric(text, "blockpool_mirror_plugin_digest_behind_blocks") == 4321
        assert metric(text, "blockpool_mirror_plugin_forward_pass_ms") == 0.035
        assert metric(text, "blockpool_mirror_plugin_digest_readings_discarded_total") == 17
        assert metric(text, "blockpool_mirror_plugin_digest_readings_stopped_total") == 5
        assert metric(text, "blockpool_mirror_plugin_digest_readings_overrun_total") == 3
        assert metric(text, "blockpool_mirror_plugin_forward_plans_too_long_total") == 2
        caught_up = DigestReading(behind=0, sweep_left=None, window_us=None, taken=3)
        rig.reading = caught_up
        await rig.drive(client, 2, 3)  # batches, then a beat (or a handshake) says it
        await until(lambda: client.status.engine_reading == caught_up)
        st = await api.ok("GET", "/api/mirror")
        assert st["plugin_digest"]["forward_pass_ms"] is None  # not known: not 0
        # a plugin that does not count its readings: not known, not 0
        assert st["plugin_digest"]["readings_discarded"] is None
        assert st["plugin_digest"]["readings_stopped"] is None
        assert st["plugin_digest"]["readings_overrun"] is None
        assert st["plugin_digest"]["plans_too_long"] is None
        text = (await api.get("/metrics")).text
        with pytest.raises(AssertionError, match="no blockpool_mirror_plugin_forward_pass_ms"):
            metric(text, "blockpool_mirror_plugin_forward_pass_ms")
        with pytest.raises(AssertionError, match="no blockpool_mirror_plugin_digest_readings"):
            metric(text, "blockpool_mirror_plugin_digest_readings_discarded_total")
        assert metric(text, "blockpool_mirror_plugin_digests_taken_total") == 3
    app.state.engine.check()


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_float_not_finite_is_a_protocol_error(bad: float) -> None:
    """Every float on the wire is finite: a figure the service shows as JSON
    (which has no NaN or infinity) can never be one a peer made so."""
    beat = wire.Beat(seq=1, ts=1.0, ops=0, drops=0, stats=(0, 0, 0), cost_us=(bad, 1.0, 2.0))
    reading = DigestReading(behind=1, window_us=bad)
    late = wire.Batch(
        seq=1, step=1, ts=bad, first_op=0, ops=[], requests=[], stats=(0, 0, 0), drops=0
    )
    for msg in (
        beat,
        wire.Beat(seq=1, ts=1.0, ops=0, drops=0, stats=(0, 0, 0), reading=reading),
        late,
    ):
        with pytest.raises(wire.ProtocolError, match="not a mirror message"):
            wire.decode(wire.encode(msg))
    assert (
        wire.decode(wire.encode(wire.Beat(seq=1, ts=1.0, ops=0, drops=0, stats=(0, 0, 0))))
        is not None
    )


async def test_a_handshake_with_a_float_not_finite_is_refused_and_the_state_still_answers(
    rig: Rig,
) -> None:
    """Before: one handshake saying an infinite forward pass (or a NaN time)
    made every ``GET /api/mirror`` a 500 until another said otherwise."""
    hello = await rig.hello()
    app, client = rig.service(hello)
    async with running(app) as api:
        await api.ok("GET", "/api/mirror")
        for bad in (float("inf"), float("nan")):
            before = client.status.bad_messages
            rig.reading = DigestReading(behind=7, window_us=bad)
            await until(lambda b=before: client.status.bad_messages > b)  # the next handshake
            st = await api.ok("GET", "/api/mirror")  # answered, as JSON
            assert st["plugin_digest"] is None and st["bad_messages"] > before
            assert "window_us" in st["last_problem"], st["last_problem"]
            assert "blockpool_mirror_plugin" not in (await api.get("/metrics")).text.replace(
                "blockpool_mirror_plugin_step", ""
            )
        rig.reading = DigestReading(behind=7, window_us=40.0)
        await until(lambda: client.status.engine_reading == rig.reading)
        assert (await api.ok("GET", "/api/mirror"))["plugin_digest"]["behind_blocks"] == 7
    app.state.engine.check()


async def test_the_plugins_time_is_known_while_the_engine_never_idles(rig: Rig) -> None:
    """A busy engine sends no beat: the handshake, re-sent every few seconds,
    carries the quantiles too."""
    hello = await rig.hello()
    app, client = rig.service(hello)
    engine = rig.engine

    def busy_until_known() -> bool:
        engine.step()  # a batch at every look: the sender is never idle long enough to beat
        return client.status.engine_cost_us is not None

    async with running(app) as api:
        await until(busy_until_known)
        q = (await api.ok("GET", "/api/mirror"))["plugin_step_us"]
        assert q is not None and 0 < q["p50"] <= q["p99"] <= q["max"]
    app.state.engine.check()
