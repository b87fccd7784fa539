"""When nothing arrives: the fleet card's hint (what to check) after
``silence_s``, and the per-instance last-batch age gauge an operator alerts
on -- against a real observer over real sockets."""

from __future__ import annotations

import asyncio
import re
import time

from app.observer.source import Source
from tests.kvevents.helpers import (
    FakePublisher,
    Workload,
    await_for,
    fake_publisher,
    free_port,
    positional,
    truth,
)
from tests.kvevents.observer_live import client, live_observer


def ages(metrics: str) -> dict[str, float]:
    pat = r'^blockpool_observer_last_batch_age_seconds\{pool="([^"]+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pat, metrics, re.M)}


def gauge(metrics: str, name: str) -> dict[str, float]:
    pat = rf'^blockpool_observer_{name}\{{pool="([^"]+)"\}} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pat, metrics, re.M)}


def test_silent_streams_say_what_to_check_and_the_age_gauge_grows() -> None:
    w = Workload(seed=95, lora=False)
    batches = w.batches(3)

    async def main() -> None:
        nobody = f"tcp://127.0.0.1:{free_port()}"  # no publisher binds here
        with fake_publisher() as right:
            endpoints = [f"ghost={nobody}", f"ok={right.endpoint}"]
            async with live_observer(endpoints=endpoints, silence_s=0.5) as app:
                srcs: dict[str, Source] = app.state.fleet.sources
                async with client(app) as h:
                    ok = srcs["ok"]
                    await await_for(lambda: ok.connected, what="ok to connect")
                    await asyncio.to_thread(right.wait_subscribed)
                    for i, evs in enumerate(batches):
                        right.send(i, positional(evs))
                    await await_for(lambda: ok.tracker.applied == 2, what="ok fed")

                    async def hints() -> dict[str, str | None]:
                        fleet = (await h.get("/api/fleet")).json()
                        return {i["name"]: i["silence_hint"] for i in fleet["instances"]}

                    got: dict[str, str | None] = {}

                    async def hinted() -> bool:
                        got.update(await hints())
                        return got["ghost"] is not None

                    deadline = time.monotonic() + 20
                    while not await hinted():
                        assert time.monotonic() < deadline, got
                        await asyncio.sleep(0.05)
                    assert got["ok"] is None  # it received batches: nothing to say
                    ghost = got["ghost"] or ""
                    assert "never connected" in ghost and nobody in ghost
                    assert "bind" in ghost and "--kv-events-bind bind" in ghost
                    assert not srcs["ghost"].connected
                    assert ok.state.copies() == truth(batches)
                    ok.state.check()
        w.check()

    asyncio.run(main())


def test_a_connected_but_silent_stream_names_the_topic() -> None:
    async def main() -> None:
        with fake_publisher(topic=b"other") as fp:
            async with live_observer(
                endpoints=[f"p={fp.endpoint}"], silence_s=0.3, topic="kv"
            ) as app:
                s: Source = app.state.fleet.sources["p"]
                async with client(app) as h:
                    await await_for(lambda: s.connected, what="the SUB to connect")
                    fp.send(0, positional([]))  # topic 'other': filtered out by the SUB
                    hint: str | None = None
                    deadline = time.monotonic() + 20
                    while hint is None:
                        assert time.monotonic() < deadline
                        hint = (await h.get("/api/fleet/p")).json()["silence_hint"]
                        await asyncio.sleep(0.05)
                    assert "connected" in hint and "'kv'" in hint and "topic" in hint
                    assert s.tracker.received == 0
                    # the age gauge keeps growing while nothing arrives
                    first = ages((await h.get("/metrics")).text)["p"]
                    later = first
                    while later <= first:
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.05)
                        later = ages((await h.get("/metrics")).text)["p"]
                    assert later > first >= 0

    asyncio.run(main())


def test_the_age_gauge_is_the_time_since_the_last_batch() -> None:
    w = Workload(seed=96, lora=False)
    batches = w.batches(2)

    async def main() -> None:
        with fake_publisher() as fp:
            async with live_observer(endpoints=[f"p={fp.endpoint}"]) as app:
                s: Source = app.state.fleet.sources["p"]
                async with client(app) as h:
                    await await_for(lambda: s.connected)
                    await asyncio.to_thread(fp.wait_subscribed)
                    fp.send(0, positional(batches[0]))
                    await await_for(lambda: s.tracker.applied == 0)
                    age = ages((await h.get("/metrics")).text)["p"]
                    assert s.started_at is not None and s.last_batch_at is not None
                    # at most the time since the batch, measured here after the scrape
                    assert 0 <= age <= time.time() - s.last_batch_at
                    fp.send(1, positional(batches[1]))
                    at = s.last_batch_at
                    await await_for(lambda: s.tracker.applied == 1)
                    assert s.last_batch_at > at
                    assert (
                        ages((await h.get("/metrics")).text)["p"] <= time.time() - s.last_batch_at
                    )
                    assert s.state.copies() == truth(batches)
                    s.state.check()
        w.check()

    asyncio.run(main())


def test_a_publisher_that_goes_away_after_data_makes_its_pool_stale() -> None:
    """Data, then the publisher is killed: after ``silence_s`` the pool is
    stale (card hint, health degraded, gauge 1) while the other stays fine;
    an idle but connected publisher is not stale."""
    w1, w2 = Workload(seed=97, lora=False), Workload(seed=98, lora=False)
    dying_batches, idle_batches = w1.batches(3), w2.batches(2)

    async def main() -> None:
        dying = FakePublisher()
        try:
            with fake_publisher() as idle:
                endpoints = [f"dying={dying.endpoint}", f"idle={idle.endpoint}"]
                async with live_observer(endpoints=endpoints, silence_s=0.5) as app:
                    srcs: dict[str, Source] = app.state.fleet.sources
                    async with client(app) as h:
                        for fp, name, batches in (
                            (dying, "dying", dying_batches),
                            (idle, "idle", idle_batches),
                        ):
                            await await_for(lambda n=name: srcs[n].connected, what="connect")
                            await asyncio.to_thread(fp.wait_subscribed)
                            for i, evs in enumerate(batches):
                                fp.send(i, positional(evs))
                            last = len(batches) - 1
                            await await_for(
                                lambda n=name, q=last: srcs[n].tracker.applied == q, what="fed"
                            )
                        health = (await h.get("/api/health")).json()
                        assert health["status"] == "ok" and health["stale"] == []
                        dying.close()  # the process is gone: its connection closes
                        deadline = time.monotonic() + 30
                        while True:
                            health = (await h.get("/api/health")).json()
                            if health["stale"]:
                                break
                            assert time.monotonic() < deadline, health
                            await asyncio.sleep(0.05)
                        assert health["status"] == "degraded" and health["stale"] == ["dying"]
                        card = (await h.get("/api/fleet/dying")).json()
                        assert card["stale"] is True and card["connected"] is False
                        assert card["silent_s"] >= 0.5 and card["complete"] is True
                        # complete, but the last one heard: not exact, everywhere it shows
                        assert card["exact"] is False and card["inexact_reason"].startswith("stale")
                        assert health["exact"] == 1  # the idle one only
                        hashmap = (await h.get("/api/fleet/dying/hashmap")).json()
                        tree = (await h.get("/api/fleet/dying/prefix-tree")).json()
                        assert hashmap["exact"] is False and tree["exact"] is False
                        assert (
                            "stale" in card["stale_hint"] and dying.endpoint in card["stale_hint"]
                        )
                        # the map is the last one heard, not wiped
                        assert srcs["dying"].state.copies() == truth(dying_batches)
                        # connected and silent just as long: idle, not stale
                        other = (await h.get("/api/fleet/idle")).json()
                        await await_for(lambda: srcs["idle"].idle(time.time()), what="idle")
                        other = (await h.get("/api/fleet/idle")).json()
                        assert other["stale"] is False and other["idle"] is True
                        assert other["stale_hint"] is None
                        metrics = (await h.get("/metrics")).text
                        assert gauge(metrics, "stale") == {"dying": 1.0, "idle": 0.0}
                        assert gauge(metrics, "exact") == {"dying": 0.0, "idle": 1.0}
                        assert set(ages(metrics)) == {"dying", "idle"}
                        fleet = (await h.get("/api/fleet")).json()
                        by_name = {i["name"]: i for i in fleet["instances"]}
                        assert by_name["dying"]["stale"] and not by_name["idle"]["stale"]
                        assert srcs["idle"].state.copies() == truth(idle_batches)
                        srcs["idle"].state.check()
        finally:
            dying.close()
        w1.check()
        w2.check()

    asyncio.run(main())


def test_a_stale_pool_is_live_again_when_its_publisher_returns() -> None:
    w = Workload(seed=99, lora=False)
    batches = w.batches(4)

    async def main() -> None:
        fp = FakePublisher()
        try:
            async with live_observer(endpoints=[f"p={fp.endpoint}"], silence_s=0.3) as app:
                s: Source = app.state.fleet.sources["p"]
                async with client(app) as h:
                    await await_for(lambda: s.connected, what="connect")
                    await asyncio.to_thread(fp.wait_subscribed)
                    fp.send(0, positional(batches[0]))
                    await await_for(lambda: s.tracker.applied == 0, what="fed")
                    endpoint = fp.endpoint
                    fp.close()
                    await await_for(lambda: s.stale(time.time()), 30, what="stale")
                    assert (await h.get("/api/health")).json()["status"] == "degraded"
                    fp = FakePublisher(endpoint=endpoint)  # the same address, back
                    await await_for(lambda: s.connected, 30, what="reconnect")
                    await asyncio.to_thread(fp.wait_subscribed)
                    for i in range(1, 4):
                        fp.send(i, positional(batches[i]))
                    await await_for(lambda: s.tracker.applied == 3, what="fed again")
                    health = (await h.get("/api/health")).json()
                    assert health["status"] == "ok" and health["stale"] == []
                    assert s.state.copies() == truth(batches) and s.tracker.exact
                    s.state.check()
        finally:
            fp.close()
        w.check()

    asyncio.run(main())
