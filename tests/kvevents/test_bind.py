"""``blockpool observe --bind``: the observer listens and publishers whose
endpoint is a concrete host connect to it (what vLLM does with
``tcp://observer-host:5557``) -- over real sockets, and the plan."""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq

from app.cli import main as cli_main
from app.cli import parser
from app.cli.settings import observer_settings_from
from app.observer.source import Source
from blockpool.kvevents.config import KVEventsConfig, plan_sources
from blockpool.kvevents.publisher import KVEventPublisher
from tests.kvevents.helpers import Workload, await_for, free_port, positional, truth
from tests.kvevents.observer_live import client, live_observer


def test_publishers_that_connect_feed_a_bound_observer() -> None:
    w1, w2 = Workload(seed=301, lora=False), Workload(seed=302, lora=False)
    raw_batches = w2.batches(5)
    port_a, port_b, replay_a = free_port(), free_port(), free_port()

    async def main() -> None:
        binds = [f"a=tcp://127.0.0.1:{port_a}", f"tcp://127.0.0.1:{port_b}"]
        replays = [f"tcp://127.0.0.1:{replay_a}", "none"]
        async with live_observer(
            bind_endpoints=binds, replay_endpoints=replays, silence_s=0.5
        ) as app:
            srcs: dict[str, Source] = app.state.fleet.sources
            assert set(srcs) == {"a", f"127.0.0.1:{port_b}"}
            b = srcs[f"127.0.0.1:{port_b}"]
            async with client(app) as h:
                # before anyone connects: the hint says the publisher must connect here
                await await_for(lambda: srcs["a"].task_alive, what="the socket loop")
                hint = None
                deadline = time.monotonic() + 30
                while hint is None:
                    assert time.monotonic() < deadline
                    hint = (await h.get("/api/fleet/a")).json()["silence_hint"]
                    await asyncio.sleep(0.05)
                assert "--bind" in hint and "must connect here" in hint
                # blockpool's own publisher given a concrete address connects (as vLLM does)
                pub = KVEventPublisher(
                    KVEventsConfig(
                        endpoint=f"tcp://127.0.0.1:{port_a}",
                        replay_endpoint=f"tcp://127.0.0.1:{replay_a}",
                    )
                )
                assert pub.config.mode == "connect"
                pub.start()
                # and a raw PUB that connects, for the second
                ctx = zmq.Context()
                raw = ctx.socket(zmq.XPUB)
                raw.setsockopt(zmq.LINGER, 0)
                raw.connect(f"tcp://127.0.0.1:{port_b}")
                try:
                    await await_for(lambda: srcs["a"].connected and b.connected, 30, "connects")
                    assert raw.poll(30_000) and raw.recv()[:1] == b"\x01"  # subscribed
                    for i, evs in enumerate(raw_batches):
                        raw.send_multipart([b"", i.to_bytes(8, "big"), positional(evs)])
                    await await_for(lambda: b.tracker.applied == 4, 30, "raw batches")
                    a = srcs["a"]
                    ts = time.time()
                    while a.tracker.received == 0:  # the slow joiner: publish until heard
                        evs = w1.step()
                        if evs:
                            pub.publish_events(ts, evs)
                        await asyncio.sleep(0.02)
                    for _ in range(30):
                        evs = w1.step()
                        if evs:
                            pub.publish_events(ts, evs)
                    await await_for(
                        lambda: (
                            pub.counts.batches_published + pub.counts.batches_dropped
                            == pub._next_seq
                        ),
                        30,
                        "every batch sent",
                    )
                    await await_for(
                        lambda: a.tracker.applied == pub.last_published_seq, 30, "applied"
                    )
                    assert b.state.copies() == truth(raw_batches) and b.tracker.exact
                    # what the connecting PUB sent before the subscription reached it
                    # came by the bootstrap replay: the map is the pool's, exactly
                    assert a.state.copies() == w1.pool_copies() and a.tracker.exact
                    fleet = (await h.get("/api/fleet")).json()
                    modes = {i["name"]: i["mode"] for i in fleet["instances"]}
                    assert set(modes.values()) == {"bind"}
                    assert all(i["connected"] for i in fleet["instances"])
                    a.state.check()
                    b.state.check()
                    # the raw publisher goes away: its pool goes stale, the other not
                    raw.close(linger=0)
                    await await_for(lambda: b.stale(time.time()), 30, what="stale")
                    health = (await h.get("/api/health")).json()
                    assert health["stale"] == [b.name] and health["status"] == "degraded"
                    card = (await h.get(f"/api/fleet/{b.name}")).json()
                    assert "bound here" in card["stale_hint"]
                finally:
                    raw.close(linger=0)
                    ctx.term()
                    pub.stop()
        w1.check()
        w2.check()

    asyncio.run(asyncio.wait_for(main(), 180))


def test_the_bind_plan_names_expands_and_matches_replays() -> None:
    specs = plan_sources(
        ["x=tcp://gpu-1:5557"],
        ["tcp://gpu-1:5558", "none"],
        dp_size=2,
        binds=["tcp://*:6000"],
    )
    got = [(s.name, s.endpoint, s.replay_endpoint, s.bind) for s in specs]
    assert got == [
        ("x-dp0", "tcp://gpu-1:5557", "tcp://gpu-1:5558", False),
        ("x-dp1", "tcp://gpu-1:5558", "tcp://gpu-1:5559", False),
        ("any:6000", "tcp://*:6000", None, True),
        ("any:6001", "tcp://*:6001", None, True),
    ]
    with pytest.raises(ValueError, match="connects to it; give a host"):
        plan_sources(["tcp://*:5557"])
    with pytest.raises(ValueError, match="the port the publishers connect to"):
        plan_sources([], binds=["tcp://127.0.0.1:*"])
    with pytest.raises(ValueError, match="the endpoints first, then the --bind ones"):
        plan_sources(["tcp://h:1"], ["none"], binds=["tcp://127.0.0.1:2"])
    with pytest.raises(ValueError, match="observed twice"):
        plan_sources(["tcp://127.0.0.1:7"], binds=["tcp://127.0.0.1:7"])


def test_the_cli_takes_bind_and_needs_some_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["observe", "--bind", "e=tcp://127.0.0.1:7001", "--max-hashes", "9"])
    s = observer_settings_from(args)
    assert s.bind_endpoints == ["e=tcp://127.0.0.1:7001"] and s.max_hashes == 9
    assert [(x.name, x.bind) for x in s.sources()] == [("e", True)]
    assert cli_main(["observe"]) == 2
    assert "give at least one ENDPOINT or --bind ENDPOINT" in capsys.readouterr().err
