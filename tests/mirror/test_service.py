"""``serve --mirror``: the service follows an engine over ZMQ, read only, exact.

The engine is a blockpool runtime followed exactly as the plugin follows
vLLM's pool (tests/mirror/workload.py), its batches sent by the plugin's own
sender thread; the service is the real app with the mirror installed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from fastapi import FastAPI

from app.main import create_app
from app.mirror import setup as mirror_setup
from app.mirror import status as mirror_status
from app.mirror.client import MirrorClient
from blockpool.analysis.core import Analysis
from blockpool.mirror import pool_digest
from blockpool.mirror.protocol import REQ_PREEMPTED, Hello
from blockpool_vllm.sender import Sender
from tests.app.conftest import assert_error, free_port, make_settings, running
from tests.mirror.workload import BLOCK, FollowedEngine

pytestmark = pytest.mark.anyio


class Rig:
    def __init__(self, free_order: str) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.engine = FollowedEngine(free_order=free_order)
        self.sender = Sender(
            self.endpoint,
            lambda: self.engine.hello(self.sender.control_port),
            self.engine.follower.capture,
            self.engine.stats,
            control_endpoint=f"tcp://127.0.0.1:{free_port()}",
        )
        self.engine.send = self.sender.offer

    def close(self) -> None:
        self.sender.close()

    async def hello(self) -> Hello:
        return await anyio.to_thread.run_sync(mirror_setup.wait_hello, self.endpoint, 30.0)

    def service(self, hello: Hello, **overrides: Any) -> tuple[FastAPI, MirrorClient]:
        """The real app, mirroring this engine (settings: the handshake's)."""
        app = create_app(mirror_setup.settings_for(hello, make_settings(**overrides)))
        control = mirror_setup.control_for(self.endpoint, hello)
        return app, mirror_setup.install(app, self.endpoint, control)

    async def drive(self, client: MirrorClient, rounds: int, steps: int) -> None:
        """``rounds`` times ``steps`` engine steps, then until the mirror caught up."""
        await until(lambda: self.caught_up(client))
        for _ in range(rounds):
            self.engine.drive(steps)
            await anyio.sleep(0)
        await until(lambda: self.caught_up(client))

    def caught_up(self, client: MirrorClient) -> bool:
        """The mirror applied every operation the engine did."""
        f = self.engine.follower
        return client.applier.synced and client.applier.next_op == f.op_count == f.first_op


def metric(text: str, name: str) -> float:
    """The value of one sample of ``name`` (any labels) in a Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


async def until(what: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        await anyio.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture(params=["append_all", "uncached_first"])
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    r = Rig(request.param)
    r.sender.start()
    try:
        yield r
    finally:
        r.close()


async def test_the_service_mirrors_the_engine_exactly_and_read_only(rig: Rig) -> None:
    engine = rig.engine
    engine.drive(20)  # a start mid-run: the mirror begins from a snapshot
    hello = await rig.hello()
    assert hello.num_gpu_blocks == 64 and hello.free_order == engine.free_order
    settings = mirror_setup.settings_for(hello, make_settings(demo=True))
    assert not settings.demo and settings.free_order == engine.free_order
    app = create_app(settings)
    client = mirror_setup.install(app, rig.endpoint, mirror_setup.control_for(rig.endpoint, hello))
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
        assert metric(text, "vllm:prefix_cache_hits_total") == stats.hits > 0
        assert metric(text, "vllm:prefix_cache_queries_total") == stats.queries

        st = await api.ok("GET", "/api/mirror")
        assert st["connected"] and st["exact"] and st["synced"] and not st["stale"]
        # every answer says it comes from a mirror (the dashboard shows its item then)
        assert (await api.get("/api/config")).headers["x-blockpool-mirror"] == "1"
        assert st["divergences"] == 0 and st["gaps"] == 0 and st["resyncs"] == 1
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
        await until(lambda: client.status.gaps >= 1 and client.status.resyncs >= 2)
        await until(lambda: rig.caught_up(client))
        assert pool_digest(mine.pool) == pool_digest(engine.rt.pool)
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
    hello = await rig.hello()
    assert not hello.exact
    app = create_app(mirror_setup.settings_for(hello, make_settings()))
    client = mirror_setup.install(app, rig.endpoint, mirror_setup.control_for(rig.endpoint, hello))
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


async def test_an_engine_requests_story_is_the_request_story(rig: Rig) -> None:
    engine = rig.engine
    engine.tell_requests = True
    hello = await rig.hello()
    app, client = rig.service(hello)
    mine = app.state.engine

    async with running(app) as api:
        await until(lambda: rig.caught_up(client))
        known_before = set(engine.rt.manager.requests)
        for _ in range(30):
            engine.drive(2)
            await anyio.sleep(0)
        # one running request is preempted (the plugin says so as it frees it)
        running_now = [r for r in engine.rt.manager.requests if r not in known_before]
        assert running_now
        rid = running_now[0]
        managed = engine.rt.manager.requests[rid]
        engine.follower.request([REQ_PREEMPTED, rid, time.time(), managed.num_tokens])
        engine.follower.flush()
        await until(lambda: rig.caught_up(client))
        await until(lambda: client.book.requests.get(rid, {}).get("preemptions") == 1)
        assert pool_digest(mine.pool) == pool_digest(engine.rt.pool)

        s = await api.ok("GET", f"/api/requests/{rid}/story")
        assert s["request_id"] == rid and s["state"] == "running"
        assert s["num_prompt_tokens"] == managed.request.num_prompt_tokens
        assert s["num_hit_blocks"] == managed.num_hit_blocks
        assert s["hit_tokens"] == s["num_hit_blocks"] * BLOCK
        assert s["preemptions"] == 1 and s["sources"]["engine"]
        assert s["sources"]["miss_reasons"]
        assert sum(s["misses"].values()) == len(s["blocks"]) - s["num_hit_blocks"]
        hashes = [f"{int.from_bytes(bytes(h)[-8:], 'big'):016x}" for h in managed.block_hashes]
        prompt_blocks = -(-managed.request.num_prompt_tokens // BLOCK)
        assert len(s["blocks"]) == prompt_blocks
        full = managed.request.num_prompt_tokens // BLOCK  # the hashed prompt blocks
        assert [b["hash"] for b in s["blocks"]] == hashes[:full] + [None] * (prompt_blocks - full)
        assert [b["hit"] for b in s["blocks"]].count(True) == s["num_hit_blocks"]
        # each hashed block: a block of the mirror's pool holding that hash now,
        # as the engine's does (the request's own block where it alone holds it)
        table = managed.block_tables[0]
        checked = 0
        for b, own in zip(s["blocks"], table, strict=False):
            if b["hash"] is None:
                continue
            checked += 1
            (bid,) = b["block_ids"]
            held = mine.pool.blocks[bid].block_hash
            assert (
                held is not None
                and f"{int.from_bytes(bytes(held)[-12:-4], 'big'):016x}" == (b["hash"])
            )
            assert engine.rt.pool.blocks[bid].block_hash == held
            if own.block_hash == held:
                holders = engine.rt.pool.cached_block_hash_to_block._cache[held]
                assert bid == own.block_id or isinstance(holders, dict)
        assert checked >= 3  # every prompt starts with a 3-block shared prefix
        assert [x["op"] for x in s["timeline"]] == ["arrive", "schedule", "preempt"]
        assert s["times"]["first_attempt_at"] == s["timeline"][0]["ts"]

        # a finished request: its state, total tokens and the finish in its timeline
        done = next(
            r
            for r, rec in client.book.requests.items()
            if rec["finished"] is not None and rec["prompt_tokens"] is not None
        )
        s = await api.ok("GET", f"/api/requests/{done}/story")
        assert s["state"] == "finished" and s["timeline"][-1]["op"] == "finish"
        assert s["num_tokens"] == client.book.requests[done]["num_tokens"]
        assert s["times"]["finished_at"] == s["timeline"][-1]["ts"]

        # an id the engine never told of: the one error shape, nothing changed
        before = pool_digest(mine.pool)
        r = await api.get("/api/requests/no-such-request/story")
        assert_error(r, 404, "not_found")
        assert "told of no request" in r.json()["error"]["message"]
        assert pool_digest(mine.pool) == before
    mine.check()
    engine.rt.check()


async def test_the_metrics_carry_the_engines_model_name(rig: Rig) -> None:
    rig.engine.model = "tiny-llama"
    hello = await rig.hello()
    assert hello.model == "tiny-llama"
    assert mirror_setup.settings_for(hello, make_settings()).model_name == "tiny-llama"
    # an engine that names no model: "vllm-mirror"; a --model-name given stays
    hello.model = None
    assert mirror_setup.settings_for(hello, make_settings()).model_name == "vllm-mirror"
    assert mirror_setup.settings_for(hello, make_settings(model_name="m")).model_name == "m"
    hello.model = "tiny-llama"
    app = create_app(mirror_setup.settings_for(hello, make_settings()))
    client = mirror_setup.install(app, rig.endpoint, mirror_setup.control_for(rig.endpoint, hello))
    async with running(app) as api:
        rig.engine.drive(5)
        await until(lambda: client.applier.synced)
        text = (await api.get("/metrics")).text
        samples = [x for x in text.splitlines() if x.startswith("vllm:prefix_cache_queries_total{")]
        assert samples and all('model_name="tiny-llama"' in x for x in samples)
        cfg = await api.ok("GET", "/api/config")
        assert cfg["model_name"] == "tiny-llama"
    app.state.engine.check()


async def test_a_resync_takes_the_worker_analysis_along(rig: Rig) -> None:
    """analysis_mode=worker: the replica in the worker follows the mirror's
    pool across a resync (the snapshot is no operation of the recording)."""
    engine = rig.engine
    engine.tell_requests = True
    engine.drive(20)  # mid-run: the first resync already jumps the pool
    hello = await rig.hello()
    app, client = rig.service(hello, analysis_mode="worker")
    mine = app.state.engine
    host = mine.analysis
    assert host is not None and host.remote is not None

    async def replica() -> dict[str, Any]:
        await until(lambda: host.remote.cid)
        return await host.query("pool")

    async with running(app) as api:
        await rig.drive(client, 10, 3)
        got = await replica()
        assert got["digest"] == pool_digest(mine.pool) == pool_digest(engine.rt.pool)
        evictions_before = (await host.query("regret", limit=10))["evictions_total"]
        assert evictions_before > 0
        reopened = host.remote.resyncs

        # a gap: batches lost, the mirror resyncs from the engine's snapshot
        engine.accept = False
        engine.drive(4)
        engine.accept = True
        resyncs = client.status.resyncs
        engine.drive(6)
        await until(lambda: client.status.resyncs > resyncs)
        await until(lambda: rig.caught_up(client))
        got = await replica()
        assert got["digest"] == pool_digest(mine.pool) == pool_digest(engine.rt.pool)
        assert got["free_blocks"] == mine.pool.get_num_free_blocks()
        # the replica followed (not restarted): what it counted goes on
        assert host.remote.resyncs == reopened
        assert (await host.query("regret", limit=10))["evictions_total"] >= evictions_before
        st = await api.ok("GET", "/api/mirror")
        assert st["exact"] and st["gaps"] >= 1
        assert host.remote.error is None
    mine.check()
    engine.rt.check()


async def test_the_engines_misses_get_the_simulated_pools_reasons(rig: Rig) -> None:
    """Each request's blocks, classified from hashes and lengths on the
    mirror, get the reasons blockpool's own analysis gives the same
    admissions on the engine's pool (less what needs the tokens: a block
    the prompts diverge in is ``cold`` without them)."""
    engine = rig.engine
    engine.tell_requests = True
    engine.admit_alone = True
    own = Analysis(engine.rt, miss_index_size=1 << 16, miss_finished_kept=1 << 12)
    engine.rt.hooks = own
    hello = await rig.hello()
    app, client = rig.service(hello, analysis_mode="inline")
    mine = app.state.engine
    async with running(app) as api:
        await rig.drive(client, 40, 5)
        compared: dict[str, int] = {}
        for rid, rec in client.book.requests.items():
            rm = own.misses.lookup(rid)
            if rec["reasons"] is None or rm is None:
                continue
            want = []
            for name0, det in own.misses.block_reasons(rm):
                name = name0
                if name == "block_size_floor" and not (det or {}).get("partial"):
                    name = "cold"  # the shared tokens: not told by hashes
                want.append(name)
            assert rec["reasons"] == want, rid
            for name in want:
                if name is not None:
                    compared[name] = compared.get(name, 0) + 1
        assert {"cold", "evicted", "block_size_floor"} <= set(compared), compared

        # the tally the dashboard shows (the stream's section, GET /api/misses)
        got = await api.ok("GET", "/api/misses")
        assert got["engine_requests"] and got["admissions"] == client.misses.admissions
        assert {k: v["blocks"] for k, v in got["reasons"].items() if v["blocks"]} == {
            k: v for k, v in client.misses.section()["misses"].items() if v
        }
        total = sum(sum(1 for x in r["reasons"] or () if x) for r in client.book.requests.values())
        assert got["missed"]["blocks"] == total > 0
        section = mine.analysis.stream_section()
        assert section["misses"] == client.misses.section()["misses"]

        # a request's story names its blocks' reasons
        rid = next(
            r for r, rec in client.book.requests.items() if "evicted" in (rec["reasons"] or ())
        )
        s = await api.ok("GET", f"/api/requests/{rid}/story")
        assert s["sources"]["miss_reasons"]
        assert [b["reason"] for b in s["blocks"]] == client.book.requests[rid]["reasons"]
        ev = next(b for b in s["blocks"] if b["reason"] == "evicted")
        assert ev["detail"] and (ev["detail"].get("in_step") or ev["detail"]["block_id"] > 0)
        rows = (await api.ok("GET", "/api/mirror/requests"))["requests"]
        assert any(row["misses"] and row["misses"].get("evicted") for row in rows)
    mine.check()
    engine.rt.check()


async def test_the_pages_stream_carries_the_newest_applied_batchs_engine_time(rig: Rig) -> None:
    """A websocket client of the mirror's live stream (the page's protocol)
    gets, in every frame after a batch, that batch's engine step time."""
    import asyncio
    import contextlib

    import zmq
    import zmq.asyncio

    from app.stream.client import StreamClient
    from app.stream.protocol import Frame
    from blockpool.mirror import protocol as wire
    from tests.stream.live import serving, ws_url

    sent: dict[int, float] = {}  # the engine's batches as they went out: seq -> ts
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, wire.TOPIC)
    sub.connect(rig.endpoint)

    async def listen() -> None:
        while True:
            _, body = await sub.recv_multipart()
            msg = wire.decode(body)
            if isinstance(msg, wire.Batch):
                sent[msg.seq] = msg.ts

    heard: list[dict[str, Any]] = []

    def on_frame(frame: Frame) -> None:
        if "mirror" in frame.header:
            heard.append(frame.header["mirror"])

    hello = await rig.hello()
    app, client = rig.service(hello, tick_hz=50.0)
    listener = asyncio.create_task(listen())
    try:
        async with serving(app), StreamClient(ws_url(app), on_frame=on_frame) as page:
            await page.wait_until(lambda m: m.seq is not None, timeout=60)
            await until(lambda: rig.caught_up(client))

            def one_step_heard() -> bool:  # the listener is in before the batches it checks
                if not sent:
                    rig.engine.drive(1)
                return bool(sent)

            await until(one_step_heard)
            first = max(sent)
            await rig.drive(client, 10, 3)
            last = client.status.last_seq
            assert last > first
            await until(lambda: heard and heard[-1]["batch"] == last)
            assert heard[-1]["engine_ts"] == sent[last]
            checked = [h for h in heard if h["batch"] >= first]
            assert checked and all(h["engine_ts"] == sent[h["batch"]] for h in checked)
            batches = [h["batch"] for h in heard]
            assert batches == sorted(batches)  # never an older batch after a newer one
        app.state.engine.check()
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        sub.close(0)
        ctx.term()
    rig.engine.rt.check()


async def test_a_service_that_is_no_mirror_sends_no_mirror_header() -> None:
    from app.stream import protocol as p

    app = create_app(make_settings())
    async with running(app) as api:
        await api.ok("POST", "/api/pool/allocate", json={"num_blocks": 2})
        hub = app.state.stream
        assert "mirror" not in p.decode(hub.snapshot_frame()).header
        api.check()
    app.state.engine.check()
