"""``exact`` means exact now: only after a digest matched since the
snapshot, false at once everywhere when the engine is silent, "behind" with
its backlog, and a backlog past its bound dropped for one snapshot."""

from __future__ import annotations

import time

import anyio
import pytest

from app.mirror import status as mirror_status
from blockpool.mirror import pool_digest
from tests.app.conftest import running
from tests.mirror.rig import Rig, exact_now, gate, metric, until

pytestmark = pytest.mark.anyio


# --------------------------------------------------------- exact means exact now


async def test_exact_only_after_the_first_digest_since_the_snapshot(keyed: Rig) -> None:
    keyed.engine.drive(7)  # a start mid-run, then the engine idle: no digest comes
    while keyed.engine.follower.step % 3 == 0:  # (its last batch carries none either)
        keyed.engine.drive(1)
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    async with running(app) as api:
        await until(lambda: client.status.syncs == 1)
        st = await api.ok("GET", "/api/mirror")
        assert st["synced"] and not st["exact"] and st["state"] == "synced"
        assert st["digests_checked_since_sync"] == 0
        assert st["seconds_since_digest"] is None and st["ops_since_digest"] is None
        await exact_now(keyed, client)
        st = await api.ok("GET", "/api/mirror")
        assert st["exact"] and st["state"] == "exact" and st["digests_checked_since_sync"] >= 1
        assert 0 <= st["seconds_since_digest"] < 60
        assert 0 <= st["ops_since_digest"] <= st["ops_applied"]


def test_the_status_says_how_old_the_last_matching_digest_is() -> None:
    """``exact`` rests on the last digest that matched: /api/mirror says how
    many seconds and operations ago (not known -- None -- since a sync until
    one matches), so an engine whose plugin sends fewer shows it."""
    st = mirror_status.MirrorStatus("tcp://e", "tcp://c")
    st.resynced(1)
    st.ops_applied = 40
    d = st.as_dict()
    assert d["seconds_since_digest"] is None and d["ops_since_digest"] is None
    st.digest_matched()
    st.ops_applied += 25  # batches applied since, none with a digest
    d = st.as_dict()
    assert d["ops_since_digest"] == 25 and 0 <= d["seconds_since_digest"] < 60
    assert d["digests_checked"] == d["digests_checked_since_sync"] == 1
    st.last_digest_at = time.monotonic() - 30.0
    assert 29.0 <= st.as_dict()["seconds_since_digest"] < 60
    st.lost()  # a resync due: no digest since the sync it leads to
    assert st.as_dict()["ops_since_digest"] is None
    st.resynced(9)
    st.digest_matched()
    assert st.as_dict()["ops_since_digest"] == 0


async def test_a_silent_engine_is_not_exact_at_once_everywhere(
    keyed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror_status, "STALE_AFTER_S", 1.0)
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    hub = app.state.stream
    async with running(app) as api:
        await exact_now(keyed, client)
        assert hub.mirror_now()["exact"]
        assert metric((await api.get("/metrics")).text, "blockpool_mirror_exact") == 1
        keyed.close()  # the engine is gone: nothing marks the status, it is read so
        await until(lambda: client.status.stale)
        st = await api.ok("GET", "/api/mirror")
        assert st["stale"] and not st["exact"] and st["state"] == "stale"
        header = hub.mirror_now()
        assert header["exact"] is False and header["state"] == "stale"
        text = (await api.get("/metrics")).text
        assert metric(text, "blockpool_mirror_exact") == 0
        assert metric(text, "blockpool_mirror_stale") == 1


async def test_a_mirror_behind_says_so_with_its_backlog(
    keyed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    hello = await keyed.hello()
    app, client = keyed.service(hello, mirror_max_lag_s=0.3)
    async with running(app) as api:
        await exact_now(keyed, client)
        before = await api.ok("GET", "/api/mirror")
        go = gate(client, monkeypatch)
        for _ in range(40):
            keyed.engine.drive(1)
            await anyio.sleep(0)
        await until(lambda: client.status.as_dict()["behind"])
        st = await api.ok("GET", "/api/mirror")
        assert st["behind"] and not st["exact"] and st["state"] == "behind"
        assert st["backlog"] >= 1 and st["backlog_ms"] > 300
        assert metric((await api.get("/metrics")).text, "blockpool_mirror_behind") == 1
        await until(lambda: client.status.backlog()[0] >= 30)
        go.set()
        await exact_now(keyed, client)
        st = await api.ok("GET", "/api/mirror")
        assert st["exact"] and not st["behind"] and st["backlog"] == 0
        # the backlog went to the writer in groups, each batch checked
        batches = st["batches"] - before["batches"]
        assert batches >= 30 and st["writer_calls"] - before["writer_calls"] < batches
        assert st["gaps"] == 0 and st["divergences"] == 0 and st["resyncs"] == 0
    assert pool_digest(app.state.engine.pool) == pool_digest(keyed.engine.rt.pool)


async def test_a_backlog_past_its_bound_is_dropped_for_one_snapshot(
    keyed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    hello = await keyed.hello()
    app, client = keyed.service(hello, mirror_max_backlog=10)
    async with running(app) as api:
        await exact_now(keyed, client)
        go = gate(client, monkeypatch)
        for _ in range(40):
            keyed.engine.drive(1)
            await anyio.sleep(0)
        await until(lambda: client.status.backlog_dropped >= 20)
        assert len(client.inbox.frames) <= 10  # never held past its bound
        go.set()
        await exact_now(keyed, client)
        st = await api.ok("GET", "/api/mirror")
        assert st["resyncs"] == 1 and st["exact"]  # one snapshot for the whole backlog
        text = (await api.get("/metrics")).text
        assert metric(text, "blockpool_mirror_backlog_dropped_total") == st["backlog_dropped"]
    assert pool_digest(app.state.engine.pool) == pool_digest(keyed.engine.rt.pool)
