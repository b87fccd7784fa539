"""``serve --mirror``: the page's live stream carries the newest applied
batch's engine time; a service that is no mirror sends no mirror header."""

from __future__ import annotations

from typing import Any

import pytest

from app.main import create_app
from tests.app.conftest import make_settings, running
from tests.mirror.rig import Rig, until

pytestmark = pytest.mark.anyio


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
            _, body, _mac = await sub.recv_multipart()
            msg = wire.decode(body)
            for batch in wire.batches_of(msg):
                sent[batch.seq] = batch.ts

    heard: list[dict[str, Any]] = []

    def on_frame(frame: Frame) -> None:  # (before the first batch applied: batch None)
        if "mirror" in frame.header and frame.header["mirror"]["batch"] is not None:
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
            # the engine's newest batch (not the client's ``last_seq``: the
            # client counts a group's batches once the writer call that applied
            # them returns, a turn of the loop after ``caught_up`` can see them)
            last = rig.engine.follower.seq
            assert last > first
            await until(lambda: heard and heard[-1]["batch"] == last and last in sent)
            await until(lambda: client.status.last_seq == last)
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
