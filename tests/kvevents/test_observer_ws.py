"""The observer's websocket takes what the page sends bounded: a message over
the limit closes that socket (1009), a binary one too (1003), each counted;
the hub and the other clients go on, and ``/api/fleet`` shows the counts."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from app.web.ws_endpoint import MAX_MESSAGE_BYTES
from tests.kvevents.helpers import await_for
from tests.kvevents.observer_live import client, live_observer, ws_ticks


async def _read_until_closed(ws: websockets.ClientConnection) -> None:
    async with asyncio.timeout(30):
        while True:
            await ws.recv()


async def closed_with(ws: websockets.ClientConnection) -> int:
    with pytest.raises(websockets.exceptions.ConnectionClosed) as exc:
        await _read_until_closed(ws)
    assert exc.value.rcvd is not None
    return exc.value.rcvd.code


def test_oversized_and_binary_messages_close_only_their_socket() -> None:
    async def main() -> None:
        async with live_observer(endpoints=["tcp://127.0.0.1:1"]) as app, client(app) as h:
            url = f"ws://127.0.0.1:{app.state.port}/api/fleet/stream"
            hub = app.state.hub
            async with websockets.connect(url) as keeper:
                assert json.loads(await keeper.recv())["type"] == "hello"
                async with websockets.connect(url) as ws:
                    await ws.recv()
                    await ws.send("x" * MAX_MESSAGE_BYTES)  # at the limit: read, ignored
                    await ws.send("x" * (MAX_MESSAGE_BYTES + 1))
                    assert await closed_with(ws) == 1009
                async with websockets.connect(url) as ws:
                    await ws.recv()
                    await ws.send(b"\x00")
                    assert await closed_with(ws) == 1003
                await await_for(lambda: len(hub.fan) == 1, what="two clients gone")
                # the other client still gets ticks
                first = hub.seq
                ticks = await ws_ticks(keeper, until=lambda m: m["seq"] > first + 1)
                assert ticks[-1]["type"] == "tick"
                stream = (await h.get("/api/fleet")).json()["stream"]
                assert stream["clients"] == 1 and stream["refused_total"] == 2
                assert stream["disconnects_total"] == 2 and stream["drops_total"] == 0
                metrics = (await h.get("/metrics")).text
                assert "blockpool_observer_ws_refused_total 2.0" in metrics

    asyncio.run(main())
