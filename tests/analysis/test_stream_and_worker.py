"""The stream's analysis section, and shadows in the worker process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.pool.engine import Engine
from app.stream import protocol as p
from app.stream.hub import StreamHub
from tests.analysis.conftest import admit, finish

Factory = Callable[..., Engine]


def test_analysis_rides_in_snapshots_and_about_once_a_second(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=32)
    hub = StreamHub(e)
    client = hub.connect(frozenset({"analysis"}), None)
    client.queue.get_nowait()  # the config frame
    admit(e, "a", [1, 2, 3, 4, 5, 6])
    e.tick()
    snap = p.decode(client.queue.get_nowait())  # a new client gets a snapshot first
    assert snap.kind_name == "snapshot"
    an = snap.header["analysis"]
    assert an["misses"] == {
        "last_token": 0, "block_size_floor": 1, "cold": 1, "evicted": 0,
        "extra_keys": 0, "chain_broken": 0, "reset": 0, "skipped": 0,
    }  # fmt: skip
    assert [row[0] for row in an["shadows"]][:2] == ["append_all@0.5x", "append_all@1x"]
    assert snap.header["tokens"]["held"] == 6 and snap.header["tokens"]["slots_reserved"] == 8
    finish(e, "a")
    e.tick()
    delta = p.decode(client.queue.get_nowait())
    assert delta.kind_name == "delta"
    assert "analysis" not in delta.header  # less than a second after the last one
    assert "events" not in delta.header and not delta.columns  # channels: analysis only
    assert delta.header["tokens"]["held"] == 0  # counts ride in every delta
    hub._analysis_at -= 1.0  # a second later
    e.tick()
    later = p.decode(client.queue.get_nowait()).header["analysis"]
    assert later["misses"]["cold"] == 1 and later["hit_blocks"] == 0
    # the ring keeps the all-channel frames (for resuming clients)
    assert "analysis" in p.decode(hub.ring.frames[0].full).header
    assert "analysis" in p.CHANNELS


def test_shadows_in_the_worker_process(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=32, shadow_mode="process")
    an = e.analysis
    assert an is not None and an.feeder is not None
    an.start()
    for i in range(20):
        admit(e, f"r{i}", [i % 3] * 9)
        finish(e, f"r{i}")
    e.tick()
    assert an.feeder.wait_idle(30), an.feeder.snapshot()
    rows = {r["name"]: r for r in an.feeder.latest or []}
    st = e.manager.stats
    one = rows["append_all@1x"]
    assert (one["hits"], one["queries"]) == (st.hits, st.queries)
    assert an.feeder.snapshot()["error"] is None
    an.feeder.check()  # the worker audits every shadow


def test_a_lagging_worker_is_resynced_not_waited_for(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=32, shadow_mode="process", shadow_max_lag=100)
    an = e.analysis
    assert an is not None and an.feeder is not None
    an.start()
    f = an.feeder
    assert f.wait_idle(30)
    for i in range(60):  # 120 accesses in one tick: over the bound
        admit(e, f"r{i}", [1] * 5)
        finish(e, f"r{i}")
    e.tick()
    assert f.dropped == 120 and f.need_restart
    admit(e, "x", [1] * 5)
    finish(e, "x")
    e.tick()
    assert f.wait_idle(30)
    assert f.resyncs == 1
    rows = {r["name"]: r for r in f.latest or []}
    assert rows["append_all@1x"]["requests"] == 1  # counted since the restart


def test_engine_start_stop_with_the_worker(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=32, shadow_mode="process")

    async def go() -> None:
        await e.start()
        await e.submit_op(__import__("app.pool.schemas").pool.schemas.AdmitOp(token_ids=[1] * 5))
        await e.stop()

    asyncio.run(go())
    assert e.analysis is not None and e.analysis.feeder is not None
    assert e.analysis.feeder.cid == 0  # closed
