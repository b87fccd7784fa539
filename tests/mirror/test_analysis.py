"""``serve --mirror`` with analysis: the worker's replica follows the mirror
across a resync, and the engine's misses get the reasons blockpool's own
analysis gives them."""

from __future__ import annotations

from typing import Any

import pytest

from blockpool.analysis.core import Analysis
from blockpool.mirror import pool_digest
from tests.app.conftest import running
from tests.mirror.rig import Rig, until

pytestmark = pytest.mark.anyio


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
        engine.drive(3)  # exact again once a digest matched since the resync
        await until(lambda: client.status.digests_checked_since_sync > 0 and rig.caught_up(client))
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
    engine.rt.observe(own)
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
