"""``observe --bind`` against hostile publishers, over real sockets: one
publisher per instance (a second connection's messages are refused and
counted; they can neither wipe nor forge the map), a restart recognised only
from a new connection once the publisher's closed, and a byte cap every
frame meets before it is read."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import zmq

from app.observer.source import Source
from tests.kvevents.helpers import Workload, await_for, free_port, positional, truth
from tests.kvevents.observer_live import client, live_observer

MiB = 1 << 20


@asynccontextmanager
async def connecting_pub(endpoint: str) -> AsyncIterator[zmq.Socket[Any]]:
    """A PUB that connects to the observer (as vLLM does to a concrete host),
    returned once the observer's subscription reached it (no slow joiner)."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoint)
    try:
        assert await asyncio.to_thread(pub.poll, 60_000), "no subscription"
        assert pub.recv()[:1] == b"\x01"
        yield pub
    finally:
        pub.close(linger=0)
        ctx.term()


def send(pub: zmq.Socket[Any], seq: int, payload: bytes) -> None:
    pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])


def metric(text: str, name: str, pool: str) -> float:
    prefix = f'{name}{{pool="{pool}"}} '
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, (name, pool)
    return float(lines[0][len(prefix) :])


def test_a_second_publisher_can_neither_wipe_nor_forge_the_view() -> None:
    engine, hostile, reborn = Workload(seed=401), Workload(seed=402), Workload(seed=403)
    real, forged, after = engine.batches(30), hostile.batches(5), reborn.batches(6)
    endpoint = f"tcp://127.0.0.1:{free_port()}"

    async def main() -> None:
        async with live_observer(bind_endpoints=[f"e={endpoint}"]) as app:
            src: Source = app.state.fleet.sources["e"]
            async with client(app) as h:
                # every refusal counter is there, at 0, before anything arrived
                first = (await h.get("/metrics")).text
                for name in ("refused_messages", "refused_publishers", "publisher_changes"):
                    assert metric(first, f"blockpool_observer_{name}_total", "e") == 0
                for layout in ("v016", "topic"):
                    replies = (
                        f'blockpool_observer_replay_replies_total{{layout="{layout}",pool="e"}} '
                    )
                    assert f"{replies}0.0" in first
                async with connecting_pub(endpoint) as pub:
                    for i in range(20):
                        send(pub, i, positional(real[i]))
                    await await_for(lambda: src.tracker.applied == 19, 60, "the engine's batches")
                    view = src.state.copies()
                    assert view == truth(real[:20]) and src.tracker.exact
                    async with connecting_pub(endpoint) as stranger:
                        # seq 0 again (a "restart") and a forged continuation
                        for i, evs in enumerate(forged):
                            send(stranger, i, positional(evs))
                        send(stranger, 20, positional(forged[0]))
                        await await_for(lambda: src.refused_messages == 6, 60, "refusals")
                        assert src.state.copies() == view and src.tracker.exact
                        assert src.tracker.restarts == 0 and src.tracker.applied == 19
                        # the engine carries on, its next seqs applied as ever
                        for i in range(20, 30):
                            send(pub, i, positional(real[i]))
                        await await_for(lambda: src.tracker.applied == 29, 60, "the rest")
                        assert src.state.copies() == truth(real) == engine.pool_copies()
                        assert src.tracker.exact and src.tracker.gaps == 0
                        card = (await h.get("/api/fleet")).json()["instances"][0]
                        assert card["refused_messages"] == 6 and card["refused_publishers"] == 1
                        assert card["exact"] and card["publisher_changes"] == 0
                        text = (await h.get("/metrics")).text
                        assert metric(text, "blockpool_observer_refused_messages_total", "e") == 6
                        assert metric(text, "blockpool_observer_refused_publishers_total", "e") == 1
                        src.state.check()
                        # the engine stops; it restarts: a new connection, seq 0 again
                        pub.close(linger=0)
                        await await_for(lambda: src.disconnects == 1, 60, "its close")
                        async with connecting_pub(endpoint) as pub2:
                            for i, evs in enumerate(after):
                                send(pub2, i, positional(evs))
                            await await_for(
                                lambda: src.tracker.restarts == 1 and src.tracker.applied == 5,
                                60,
                                "the restarted engine's batches",
                            )
                            assert src.state.copies() == truth(after) == reborn.pool_copies()
                            assert src.tracker.exact and src.publisher_changes == 1
                            # the stranger is still refused, however it numbers its batches
                            send(stranger, 6, positional(forged[1]))
                            await await_for(lambda: src.refused_messages == 7, 60, "refused")
                            assert src.state.copies() == truth(after)
                            assert src.refused_publishers == 1
                            src.state.check()
        for w in (engine, hostile, reborn):
            w.check()

    asyncio.run(asyncio.wait_for(main(), 240))


HUGE_SENDER = """
import sys, zmq
ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB)
pub.setsockopt(zmq.LINGER, 0)
pub.connect(sys.argv[1])
assert pub.poll(60_000) and pub.recv()[:1] == b"\\x01"
# 300 MB of zero pages: cheap to hold here, costly to whoever reads it
pub.send_multipart([b"", (0).to_bytes(8, "big"), bytes(300 << 20)], copy=False)
print("sent", flush=True)
sys.stdin.read()  # stay until the test is done
"""


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_300_mb_frame_is_refused_before_it_is_read() -> None:
    w = Workload(seed=404)
    batches = w.batches(10)
    endpoint = f"tcp://127.0.0.1:{free_port()}"

    async def main() -> None:
        async with live_observer(bind_endpoints=[f"e={endpoint}"], max_batch_bytes=MiB) as app:
            src: Source = app.state.fleet.sources["e"]
            async with client(app) as h:
                card = (await h.get("/api/fleet")).json()["instances"][0]
                assert card["max_message_bytes"] == MiB
                async with connecting_pub(endpoint) as pub:
                    for i in range(5):
                        send(pub, i, positional(batches[i]))
                    await await_for(lambda: src.tracker.applied == 4, 60, "the engine's batches")
                    view = src.state.copies()
                    before = rss_bytes()
                    sender = subprocess.Popen(
                        [sys.executable, "-c", HUGE_SENDER, endpoint],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    )  # fmt: skip
                    try:
                        assert sender.stdout is not None
                        line = await asyncio.to_thread(sender.stdout.readline)
                        assert line.strip() == "sent"
                        # the observer closed that connection on the frame's header
                        await await_for(lambda: src.disconnects >= 1, 120, "the drop")
                        grew = rss_bytes() - before
                        assert grew < 64 * MiB, f"the observer grew by {grew / MiB:.0f} MiB"
                        assert src.state.copies() == view and src.tracker.applied == 4
                        assert src.refused_messages == 0 and src.tracker.restarts == 0
                        # the engine's connection is untouched: its next batches apply
                        for i in range(5, 10):
                            send(pub, i, positional(batches[i]))
                        await await_for(lambda: src.tracker.applied == 9, 60, "the rest")
                        assert src.state.copies() == truth(batches) and src.tracker.exact
                        src.state.check()
                    finally:
                        sender.kill()
                        sender.communicate(timeout=60)
        w.check()

    asyncio.run(asyncio.wait_for(main(), 240))
