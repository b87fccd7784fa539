"""The stream against a real uvicorn server with real websocket clients."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import websockets

from app.stream import protocol as p
from app.stream.client import StreamClient
from app.stream.replica import PoolReplica
from tests.stream.live import assert_replica_exact, http, live_server, random_traffic, ws_url


async def _settled(app, *clients: StreamClient) -> None:  # type: ignore[no-untyped-def]
    """Wait for two more ticks so every client holds the current state."""
    target = app.state.stream.seq + 2
    for c in clients:
        await c.wait_until(lambda m: m.seq is not None and m.seq >= target, timeout=20)
    # Nothing may change between the last tick and the comparison.
    hub = app.state.stream
    for c in clients:
        await c.wait_until(lambda m: m.seq == hub.seq, timeout=20)


def test_the_replica_equals_the_pool_after_thousands_of_random_operations() -> None:
    async def main() -> None:
        async with (
            live_server(num_blocks=300) as app,
            http(app) as h,
            StreamClient(ws_url(app)) as c1,
            StreamClient(ws_url(app)) as c2,
        ):
            stats = await random_traffic(h, 3000, seed=7)
            assert stats["ok"] > 2000
            app.state.engine.check()
            await _settled(app, c1, c2)
            assert_replica_exact(c1.replica, app)
            assert_replica_exact(c2.replica, app)
            assert c1.replica.snapshots == 1 and c1.gaps == 0
            # KV events arrived in order, every one of them
            seqs = [e[0] for e in c1.replica.events]
            assert seqs == sorted(seqs)
            assert seqs[-1] == app.state.engine.events.last_seq

    asyncio.run(main())


def test_reset_and_evictions_reach_the_replica() -> None:
    async def main() -> None:
        async with (
            live_server(num_blocks=64) as app,
            http(app) as h,
            StreamClient(ws_url(app)) as c,
        ):
            ids = (await h.post("/api/pool/allocate", json={"num_blocks": 4})).json()
            ids = ids["block_ids"]
            body = {"block_ids": ids, "token_ids": list(range(16))}
            assert (await h.post("/api/pool/cache", json=body)).status_code == 200
            await h.post("/api/pool/free", json={"block_ids": ids[::-1]})
            await h.post("/api/pool/evict", json={"block_ids": [ids[0]]})
            await _settled(app, c)
            assert_replica_exact(c.replica, app)
            assert c.replica.counts()["cached"] == 3
            assert (await h.post("/api/pool/reset")).status_code == 200
            await _settled(app, c)
            assert_replica_exact(c.replica, app)
            assert c.replica.counts()["cached"] == 0
            assert c.replica.snapshots == 2  # a reset changes every block: a snapshot
            kinds = [e[1] for e in c.replica.events]
            assert kinds[-1] == p.EV_CLEARED

    asyncio.run(main())


def test_a_client_that_never_reads_stalls_nothing_and_later_resyncs() -> None:
    async def main() -> None:
        # 300k blocks: a snapshot of ~8 MB, more than the server's socket
        # send buffer (4 MiB at most here) plus the stalled client's 32 KiB.
        async with (
            live_server(num_blocks=300_000, block_size=16, paranoid=False) as app,
            http(app) as h,
        ):
            hub = app.state.stream
            # No compression, a small receive buffer and max_queue=0: the
            # library stops reading after the config frame, and this test
            # never calls recv() until later.
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
            sock.connect(("127.0.0.1", app.state.port))
            stalled = await websockets.connect(
                ws_url(app),
                sock=sock,
                max_size=None,
                max_queue=0,
                compression=None,
                ping_interval=None,
            )
            async with StreamClient(ws_url(app)) as healthy:
                await healthy.wait_until(lambda m: m.seq is not None, timeout=30)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while hub.counts.drops == 0:
                    await random_traffic(h, 20, seed=hub.seq)
                    assert loop.time() < deadline, "the stalled client was never dropped"
                # the engine went on and the healthy client kept up, exactly
                await random_traffic(h, 300, seed=3)
                await _settled(app, healthy)
                assert_replica_exact(healthy.replica, app)
                assert healthy.gaps == 0 and healthy.replica.snapshots == 1
                assert hub.stats()["drops_total"] >= 1
                assert app.state.metrics_sources["stream"]()["drops_total"] >= 1
                # the stalled client reads again: it resyncs to the exact state
                replica = PoolReplica()
                while replica.seq != hub.seq or loop.time() < deadline - 55:
                    replica.apply(p.decode(await asyncio.wait_for(stalled.recv(), 30)))
                    if replica.seq is not None and replica.seq == hub.seq:
                        break
                assert replica.snapshots >= 1
                assert_replica_exact(replica, app)
                app.state.engine.check()
            await stalled.close()

    asyncio.run(main())


def test_a_killed_client_reconnects_and_catches_up_from_the_ring() -> None:
    async def main() -> None:
        async with (
            live_server(num_blocks=200) as app,
            http(app) as h,
            StreamClient(ws_url(app), backoff=(0.01, 0.1)) as c,
        ):
            await c.wait_until(lambda m: m.seq is not None)
            await random_traffic(h, 200, seed=1)
            await c.drop_connection()
            await random_traffic(h, 400, seed=2)
            await _settled(app, c)
            assert c.connects >= 2
            assert c.replica.snapshots == 1  # caught up from the ring, no snapshot
            assert_replica_exact(c.replica, app)

    asyncio.run(main())


def test_a_gap_is_detected_and_resumed_from_the_ring() -> None:
    async def main() -> None:
        async with (
            live_server(num_blocks=200) as app,
            http(app) as h,
            StreamClient(ws_url(app)) as c,
        ):
            await c.wait_until(lambda m: m.seq is not None)
            c.lose_deltas = 2  # the next two deltas are "lost in transit"
            await random_traffic(h, 300, seed=5)
            await _settled(app, c)
            assert c.gaps >= 1
            assert c.replica.snapshots == 1
            assert_replica_exact(c.replica, app)

    asyncio.run(main())


def test_server_restart_gives_a_fresh_snapshot_of_the_new_server() -> None:
    async def main() -> None:
        from tests.stream.live import free_port

        port = free_port()
        client = StreamClient(f"ws://127.0.0.1:{port}/api/stream", backoff=(0.02, 0.2))
        async with live_server(port=port, num_blocks=100) as app, http(app) as h:
            client.start()
            await random_traffic(h, 200, seed=11)
            await _settled(app, client)
            old_epoch = client.replica.epoch
        async with live_server(port=port, num_blocks=120) as app2, http(app2) as h2:
            await random_traffic(h2, 100, seed=12)
            await client.wait_until(lambda m: m.epoch != old_epoch, timeout=20)
            await _settled(app2, client)
            assert len(client.replica.state) == 120
            assert_replica_exact(client.replica, app2)
        await client.close()

    asyncio.run(main())


def test_channel_subsets_and_resume_query() -> None:
    async def main() -> None:
        async with live_server(num_blocks=64) as app, http(app) as h:
            url = ws_url(app) + "?channels=series"
            async with websockets.connect(url, max_size=None) as ws:
                frames = [p.decode(await ws.recv()) for _ in range(3)]
                assert frames[0].kind == p.CONFIG
                assert frames[1].kind == p.SNAPSHOT
                await h.post("/api/pool/allocate", json={"num_blocks": 2})
                d = p.decode(await ws.recv())
                assert d.kind == p.DELTA and "point" in d.header
                assert "events" not in d.header and d.columns == {}
                assert d.header["blocks"]["in_use"] in (0, 2)
            # resume: frames after seq S come from the ring, without a snapshot
            epoch = app.state.stream.epoch
            start = app.state.stream.seq + 1
            await h.post("/api/pool/allocate", json={"num_blocks": 1})
            await asyncio.sleep(0.1)
            q = f"?resume_from={start}&epoch={epoch}"
            async with websockets.connect(ws_url(app) + q, max_size=None) as ws:
                cfg = p.decode(await ws.recv())
                first = p.decode(await ws.recv())
                assert cfg.kind == p.CONFIG and first.kind == p.DELTA and first.seq == start
                await ws.send(json.dumps({"type": "snapshot"}))
                kinds = set()
                for _ in range(20):
                    kinds.add(p.decode(await ws.recv()).kind)
                    if p.SNAPSHOT in kinds:
                        break
                assert p.SNAPSHOT in kinds
            app.state.engine.check()

    asyncio.run(main())


def test_protected_reads_need_the_token_on_the_stream() -> None:
    async def main() -> None:
        async with live_server(num_blocks=32, token="t0k", protect_reads=True) as app:
            async with websockets.connect(ws_url(app)) as ws:
                with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
            async with StreamClient(ws_url(app), token="t0k") as c:
                await c.wait_until(lambda m: m.seq is not None)
                assert_replica_exact(c.replica, app)

    asyncio.run(main())
