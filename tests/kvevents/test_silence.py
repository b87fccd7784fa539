"""When nothing arrives: the fleet card's hint (what to check) after
``silence_s``, and the per-instance last-batch age gauge an operator alerts
on -- against a real observer over real sockets."""

from __future__ import annotations

import asyncio
import re
import time

from app.observer.source import Source
from tests.kvevents.helpers import (
    Workload,
    await_for,
    fake_publisher,
    free_port,
    positional,
    truth,
)
from tests.kvevents.observer_live import client, live_observer


def ages(metrics: str) -> dict[str, float]:
    pat = r'^blockpool_observer_last_batch_age_seconds\{instance="([^"]+)"\} (\S+)$'
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
