"""Bar 13-observer-poison: one bad message cannot kill an observer source.

Over real ZMQ sockets on loopback, against a real uvicorn observer: a
msgpack batch nested 2,000 deep, a BlockStored with ``token_ids=[inf]`` and
a batch stamped ``ts=NaN`` are each refused or trimmed (counted by kind in
the source's stats, ``/api/health`` and ``/metrics``), and the next good
batch is applied, the websocket keeps ticking, the source stays connected
and a restarted publisher is followed.  A socket loop that fails anyway is
restarted by its supervisor, and health says so meanwhile."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import msgpack
import websockets

from app.observer.app import create_observer_app
from app.observer.source import Source
from app.shared.settings import ObserverSettings
from blockpool.kvevents.config import SourceSpec
from blockpool.kvevents.poison import KINDS
from tests.kvevents.helpers import Workload, await_for, fake_publisher, positional, truth
from tests.kvevents.observer_live import client, serving, ws_ticks
from tests.support.ports import free_port

DEEP = b"\x93" + msgpack.packb(1.0) + b"\x91" * 2000 + b"\x90" + msgpack.packb(0)
INF_TOKEN = msgpack.packb(
    [1.0, [["BlockStored", [0xDEAD], None, [math.inf], 1, None, "GPU", None]], 0]
)


def test_poison_messages_are_counted_and_the_next_good_batch_is_applied() -> None:
    w1, w2 = Workload(seed=91, lora=False), Workload(seed=92, lora=False)
    good, restarted = w1.batches(3), w2.batches(4)

    async def main() -> None:
        with fake_publisher() as fp:
            endpoints = [f"p={fp.endpoint}"]
            settings = ObserverSettings(endpoints=endpoints, port=free_port(), tick_hz=20)
            async with (
                serving(create_observer_app(settings), settings.port) as app,
                client(app) as h,
            ):
                s: Source = app.state.fleet.sources["p"]
                url = f"ws://127.0.0.1:{app.state.port}/api/fleet/stream"
                async with websockets.connect(url) as ws:
                    assert json.loads(await ws.recv())["type"] == "hello"
                    await await_for(lambda: s.connected, what="the SUB to connect")
                    await asyncio.to_thread(fp.wait_subscribed)
                    fp.send(0, positional(good[0]))
                    fp.send(1, DEEP)
                    fp.send(2, INF_TOKEN)
                    fp.send(3, positional(good[1], ts=math.nan))
                    fp.send(4, positional(good[2], ts=7.5))
                    ticks = await ws_ticks(ws, until=lambda m: m["instances"][0]["last_seq"] == 4)
                t = s.tracker
                assert t.applied == 4 and t.received == 5 and s.connected
                # the deep batch and the inf event are lost; everything else applied
                assert s.state.copies() == truth(good)
                s.state.check()
                assert s.poison.counts == {"too_deep": 1, "bad_number": 1, "non_finite_ts": 1}
                assert (t.decode_errors, s.malformed_events, t.exact) == (1, 1, False)
                # the NaN batch's events carry the observer's clock; the next its own
                events = [e for m in ticks for e in m["events"]]
                assert events and all(math.isfinite(e["ts"]) for e in events)
                assert {e["ts"] for e in events if e["batch_seq"] == 4} == {7.5}
                assert {e["batch_seq"] for e in events} == {0, 3, 4}

                health = (await h.get("/api/health")).json()
                assert health["status"] == "ok" and health["connected"] == 1, health
                assert health["poison_messages"] == 3 and health["down"] == {}
                one = (await h.get("/api/fleet/p")).json()
                assert one["poison"] == s.poison.counts and one["task"] == "running"
                assert one["last_batch_ts"] == 7.5
                metrics = (await h.get("/metrics")).text
                for kind in ("too_deep", "bad_number", "non_finite_ts"):
                    line = f'blockpool_observer_poison_messages_total{{kind="{kind}",pool="p"}} 1.0'
                    assert line in metrics, kind
                assert 'blockpool_observer_task_running{pool="p"} 1.0' in metrics
                assert 'blockpool_observer_last_batch_age_seconds{pool="p"}' in metrics

                # a restarted publisher (seqs from 0 again) is followed
                for i, evs in enumerate(restarted):
                    fp.send(i, positional(evs))
                await await_for(
                    lambda: t.restarts == 1 and t.applied == len(restarted) - 1,
                    what="the restarted publisher to be followed",
                )
                assert s.state.copies() == truth(restarted) and t.exact
                s.state.check()
        w1.check()
        w2.check()

    asyncio.run(main())


def test_a_failing_socket_loop_is_restarted_and_health_says_so_meanwhile() -> None:
    w = Workload(seed=93, lora=False)
    batches = w.batches(5)

    async def main() -> None:
        with fake_publisher() as fp:
            settings = ObserverSettings(endpoints=[f"p={fp.endpoint}"], port=free_port())
            app = create_observer_app(settings)
            s: Source = app.state.fleet.sources["p"]
            s.restart_backoff = (3600.0, 3600.0)  # restarted by wake() below, not by time
            real_monitor = s.sockets._monitor
            failures = [RuntimeError("the monitor socket broke")]

            async def monitor(sock: Any) -> None:
                if failures:
                    raise failures.pop()
                await real_monitor(sock)

            s.sockets._monitor = monitor  # type: ignore[method-assign]
            async with serving(app, settings.port), client(app) as h:
                await await_for(lambda: s.task_state == "restarting", what="the task to fail")
                health = (await h.get("/api/health")).json()
                assert health["status"] == "degraded" and health["down"] == {"p": "restarting"}
                one = (await h.get("/api/fleet/p")).json()
                assert one["task"] == "restarting" and one["task_restarts"] == 1
                assert "the monitor socket broke" in one["last_task_error"]
                metrics = (await h.get("/metrics")).text
                assert 'blockpool_observer_task_running{pool="p"} 0.0' in metrics
                assert 'blockpool_observer_task_restarts_total{pool="p"} 1.0' in metrics
                s.wake()
                await await_for(lambda: s.connected, what="the restarted task to connect")
                await asyncio.to_thread(fp.wait_subscribed)
                for i, evs in enumerate(batches):
                    fp.send(i, positional(evs))
                await await_for(lambda: s.tracker.applied == len(batches) - 1, what="batches")
                assert s.state.copies() == truth(batches) and s.tracker.exact
                s.state.check()
                health = (await h.get("/api/health")).json()
                assert health["status"] == "ok" and health["connected"] == 1
        w.check()

    asyncio.run(main())


def test_skipped_events_make_the_pool_inexact_until_a_clear() -> None:
    """Without sockets: a batch whose event could not be read is applied
    without it, and the pool is then a lower bound (not exact) -- until an
    AllBlocksCleared starts it afresh."""
    s = Source(SourceSpec("p", "tcp://127.0.0.1:1", None, 0))
    w = Workload(seed=94, lora=False)
    batches = w.batches(3)
    s.feed_live(0, positional(batches[0]))
    assert s.tracker.exact
    bad = msgpack.packb(
        [2.0, [["BlockStored", [5], None, [1.5], 1, None, None, None],
               ["BlockStored", [6], None, [7], 1, None, None, None]], 0]
    )  # fmt: skip
    s.feed_live(1, bad)
    t = s.tracker
    assert not t.exact and "could not be read" in (t.reason or "")
    assert s.poison.counts == {"bad_number": 1} and 6 in s.state.entries
    s.feed_live(2, positional(batches[1]))
    assert not t.exact  # still a lower bound
    s.feed_live(3, msgpack.packb([3.0, [["AllBlocksCleared"]], 0]))
    assert t.exact and s.state.copies() == {}
    s.feed_live(4, positional(batches[2]))
    assert t.exact and s.state.copies() == truth(batches[2:])
    s.state.check()
    w.check()


def test_every_poison_kind_is_exported_at_zero_before_any_message() -> None:
    """F3: a dashboard's poison panel shows 0, not "No data", from the start;
    a kind counted later is exported at its count beside the zeros."""
    settings = ObserverSettings(endpoints=["p=tcp://127.0.0.1:1"])
    app = create_observer_app(settings)
    s: Source = app.state.fleet.sources["p"]

    async def scrape() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            r = await c.get("/metrics")
            assert r.status_code == 200, r.text
            return r.text

    def samples(text: str) -> dict[str, float]:
        out = {}
        for line in text.splitlines():
            if line.startswith("blockpool_observer_poison_messages_total{"):
                labels, value = line.rsplit(" ", 1)
                out[labels] = float(value)
        return out

    before = samples(asyncio.run(scrape()))
    assert before == {
        f'blockpool_observer_poison_messages_total{{kind="{k}",pool="p"}}': 0.0 for k in KINDS
    }
    s.poison.add("too_deep", "a test")
    s.poison.add("something_new", "a kind no release knows", 2)
    after = samples(asyncio.run(scrape()))
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    assert changed == {
        'blockpool_observer_poison_messages_total{kind="too_deep",pool="p"}': 1.0,
        'blockpool_observer_poison_messages_total{kind="something_new",pool="p"}': 2.0,
    }
    assert s.poison.total == 3 and s.poison.counts == {"too_deep": 1, "something_new": 2}
