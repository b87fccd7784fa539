"""The stream's door and budget: resumes cost one cached lookup per frame and
are budgeted per client, client messages are small, nothing a client sends
is a 500, replays follow the client's channels, and the token has ways in
that keep it out of URLs."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from app.stream import protocol as p
from app.stream.intake import parse_message, parse_seq
from app.stream.ring import filter_delta
from tests.stream.live import http, live_server, random_traffic, ws_url
from tests.support.wait import eventually_async

TOKEN = "t0k"


async def _connect(url: str, **kw: Any) -> Any:
    return await websockets.connect(url, max_size=None, compression=None, **kw)


async def _until(ws: Any, pred: Callable[[p.Frame], bool]) -> p.Frame:
    """Read frames (skipping text notices) until one satisfies ``pred``."""
    while True:
        data = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(data, bytes):
            frame = p.decode(data)
            if pred(frame):
                return frame


async def _closed(ws: Any) -> tuple[int, list[dict[str, Any]]]:
    """Read until the server closes: (close code, text notices seen)."""
    notices: list[dict[str, Any]] = []

    async def read_all() -> None:
        while True:
            data = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(data, str):
                notices.append(json.loads(data))

    with pytest.raises(ConnectionClosed) as closed:
        await read_all()
    assert closed.value.rcvd is not None, "the server did not send a close frame"
    return closed.value.rcvd.code, notices


class Recorder:
    """Reads a socket in the background: every delta's bytes by seq."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.deltas: dict[int, bytes] = {}
        self.replayed: list[bytes] = []  # deltas that came again (a resume)
        self.snapshots = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for data in self.ws:
            if not isinstance(data, bytes):
                continue
            frame = p.decode(data)
            if frame.kind == p.SNAPSHOT:
                self.snapshots += 1
            elif frame.kind == p.DELTA:
                if frame.seq in self.deltas:
                    self.replayed.append(data)
                self.deltas.setdefault(frame.seq, data)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.ws.close()


async def _wait(pred: Callable[[], bool], what: str) -> None:
    await eventually_async(pred, 60.0, what)


# ------------------------------------------------------------ 1. resumes


def test_each_ring_frame_is_compressed_once_however_often_it_is_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: Counter[bytes] = Counter()
    real = p.compress_frame

    def counting(data: bytes) -> bytes:
        if data[4] == p.DELTA:
            calls[data] += 1
        return real(data)

    monkeypatch.setattr(p, "compress_frame", counting)

    async def main() -> None:
        budget = {"stream_request_burst": 1000, "stream_request_rate": 1000.0}
        async with live_server(num_blocks=128, **budget) as app, http(app) as h:
            hub = app.state.stream
            full = await _connect(ws_url(app) + "?compress=zlib")
            series = await _connect(ws_url(app) + "?compress=zlib&channels=series")
            for ws in (full, series):
                await _until(ws, lambda f: f.kind == p.SNAPSHOT)
            readers = [Recorder(full), Recorder(series)]
            await random_traffic(h, 150, seed=21)
            await _wait(lambda: hub.seq > 25, "25 ticks")
            # Two clients flood resumes of 20 frames; health answers meanwhile.
            before = hub.counts.resumes
            health = asyncio.create_task(h.get("/api/health"))
            for _ in range(40):
                for ws in (full, series):
                    await ws.send(json.dumps({"type": "resume", "from": hub.seq - 19}))
            await _wait(lambda: hub.counts.resumes >= before + 80, "80 resumes answered")
            assert (await health).status_code == 200
            await _wait(lambda: all(r.replayed for r in readers), "replayed frames arrived")
            for r in readers:
                await r.stop()
            # every delta variant was compressed once: at its tick, or at the
            # first resume that needed it (the series one), never again
            assert calls and max(calls.values()) == 1, calls.most_common(1)[0][1]
            assert sum(calls.values()) <= 2 * hub.seq
            app.state.engine.check()

    asyncio.run(main())


def test_a_client_that_keeps_asking_is_refused_then_disconnected() -> None:
    async def main() -> None:
        limits = {"stream_request_rate": 0.001, "stream_request_burst": 3, "stream_max_refused": 4}
        async with live_server(num_blocks=32, **limits) as app, http(app) as h:
            hub = app.state.stream
            ws = await _connect(ws_url(app))
            await _until(ws, lambda f: f.kind == p.SNAPSHOT)
            for _ in range(3):  # the burst: granted
                await ws.send(json.dumps({"type": "snapshot"}))
            for _ in range(3):  # refused, with a notice each
                await ws.send(json.dumps({"type": "resume", "from": hub.seq}))
            await ws.send(json.dumps({"type": "snapshot"}))  # the 4th refusal in a row
            code, notices = await _closed(ws)
            assert code == 1008
            assert [n["code"] for n in notices] == ["rate_limited"] * 3
            assert all(n["type"] == "error" and n["retry_after_s"] > 0 for n in notices)
            assert "too many resume/snapshot requests" in notices[0]["message"]
            assert hub.counts.refused == 4 and hub.counts.resyncs == 3
            assert not hub.clients
            metrics = (await h.get("/metrics")).text
            assert "blockpool_stream_refused_total 4.0" in metrics
            # junk counts as refused too (and a deep nesting is junk, not a crash)
            ws = await _connect(ws_url(app))
            await _until(ws, lambda f: f.kind == p.CONFIG)
            for junk in ("nope", "[1]", '{"type": "resume", "from": true}', "[" * 3000):
                await ws.send(junk)
            code, notices = await _closed(ws)
            assert code == 1008 and [n["code"] for n in notices] == ["bad_message"] * 3
            assert (await h.get("/api/health")).status_code == 200
            app.state.engine.check()

    asyncio.run(main())


# ------------------------------------------------------------ 2. message size


def test_client_messages_over_the_limit_close_the_socket_with_1009() -> None:
    async def main() -> None:
        async with live_server(num_blocks=32, ws_max_message_bytes=1024) as app:
            hub = app.state.stream
            ws = await _connect(ws_url(app))
            await _until(ws, lambda f: f.kind == p.SNAPSHOT)
            msg = json.dumps({"type": "snapshot", "pad": ""})
            exact = json.dumps({"type": "snapshot", "pad": "x" * (1024 - len(msg))})
            assert len(exact.encode()) == 1024
            await ws.send(exact)  # at the limit: served
            await _until(ws, lambda f: f.kind == p.SNAPSHOT)
            await ws.send(exact[:-2] + 'x"}')  # one byte over
            code, notices = await _closed(ws)
            assert code == 1009 and notices == []
            # the limit counts bytes, not characters
            ws = await _connect(ws_url(app))
            await _until(ws, lambda f: f.kind == p.CONFIG)
            await ws.send(
                json.dumps({"type": "snapshot", "pad": "\u00e9" * 600}, ensure_ascii=False)
            )
            assert (await _closed(ws))[0] == 1009
            ws = await _connect(ws_url(app))  # the stream takes text only
            await _until(ws, lambda f: f.kind == p.CONFIG)
            await ws.send(b'{"type": "snapshot"}')
            assert (await _closed(ws))[0] == 1003
            await _wait(lambda: not hub.clients, "the clients are gone")
            app.state.engine.check()

    asyncio.run(main())


# ------------------------------------------------------------ 3. the door


def test_strict_integers_in_the_query_and_in_messages() -> None:
    assert parse_seq("42") == 42 and parse_seq("0") == 0
    for bad in ("\u00b2", "\u0663", "-1", "+1", " 5", "1e3", "", None, "9" * 20, "٣"):
        assert parse_seq(bad) is None, bad
    assert parse_seq(str(2**63 - 1)) == 2**63 - 1 and parse_seq(str(2**63)) is None
    assert parse_message('{"type": "resume", "from": 7}') == parse_message(
        '{"from": 7, "type": "resume"}'
    )
    for bad in ('{"type": "resume", "from": true}', '{"type": "resume", "from": -1}',
                '{"type": "resume", "from": 1.0}', '{"type": "resume"}', "[" * 5000,
                '{"type": "resume", "from": ' + "9" * 30 + "}", "\u00b2", "{}"):  # fmt: skip
        assert parse_message(bad) is None, bad


def test_odd_queries_and_tokens_get_an_answer_never_a_500() -> None:
    async def main() -> None:
        async with live_server(num_blocks=32, token=TOKEN, protect_reads=True) as app:
            hub = app.state.stream
            base = ws_url(app)
            # a non-ASCII token (hmac.compare_digest on str raised: a 500)
            for query in ("?token=%C3%A9", "?token=%C2%B2%FF", "?token=%00"):
                ws = await _connect(base + query)
                assert (await _closed(ws))[0] == 4401
            ws = await _connect(base, subprotocols=["blockpool", "bearer.wrong"])
            assert (await _closed(ws))[0] == 4401
            # resume_from=² ("²".isdigit() is true, int() fails: a 500), too big, negative
            auth = {"additional_headers": {"Authorization": f"Bearer {TOKEN}"}}
            for seq in ("%C2%B2", "9" * 40, "-1", "%D9%A3"):
                ws = await _connect(f"{base}?resume_from={seq}&epoch={hub.epoch}", **auth)
                await _until(ws, lambda f: f.kind == p.SNAPSHOT)  # not resumable: a snapshot
                await ws.close()
            app.state.engine.check()

    asyncio.run(main())


# ------------------------------------------------------------ 4. ways in


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_the_token_as_a_subprotocol_or_a_ticket_and_only_blockpool_is_echoed() -> None:
    async def main() -> None:
        async with (
            live_server(num_blocks=32, token=TOKEN, protect_reads=True) as app,
            http(app) as h,
        ):
            base = ws_url(app)
            for protocols in (
                ["blockpool", f"bearer.{TOKEN}"],
                ["blockpool", f"base64url.bearer.{_b64(TOKEN)}"],
            ):
                ws = await _connect(base, subprotocols=protocols)
                assert ws.subprotocol == "blockpool"
                assert ws.response.headers["Sec-WebSocket-Protocol"] == "blockpool"
                await _until(ws, lambda f: f.kind == p.SNAPSHOT)
                await ws.close()
            # a ticket from an authenticated call, good once
            assert (await h.post("/api/stream/ticket")).status_code == 401
            r = await h.post("/api/stream/ticket", headers={"Authorization": f"Bearer {TOKEN}"})
            ticket = r.json()["ticket"]
            ws = await _connect(base, subprotocols=["blockpool", f"ticket.{ticket}"])
            assert ws.response.headers["Sec-WebSocket-Protocol"] == "blockpool"
            await _until(ws, lambda f: f.kind == p.SNAPSHOT)
            await ws.close()
            ws = await _connect(base, subprotocols=["blockpool", f"ticket.{ticket}"])
            assert (await _closed(ws))[0] == 4401  # used up
            # old clients: ?token= still works (discouraged; redacted in logs)
            ws = await _connect(f"{base}?token={TOKEN}")
            assert ws.subprotocol is None
            await _until(ws, lambda f: f.kind == p.SNAPSHOT)
            await ws.close()
            app.state.engine.check()

    asyncio.run(main())


# ------------------------------------------------------------ 8. channels


def test_replays_follow_the_clients_channels_exactly_like_live_frames() -> None:
    async def main() -> None:
        async with live_server(num_blocks=128) as app, http(app) as h:
            hub = app.state.stream
            live_series = await _connect(ws_url(app) + "?channels=series")
            live_all = await _connect(ws_url(app))
            for ws in (live_series, live_all):
                await _until(ws, lambda f: f.kind == p.SNAPSHOT)
            series, everything = Recorder(live_series), Recorder(live_all)
            first = hub.seq + 1
            await random_traffic(h, 120, seed=4)
            await _wait(lambda: hub.seq >= first + 12, "12 ticks")
            start = max(first, hub.seq - 20)
            end = hub.seq
            await _wait(lambda: end in series.deltas and end in everything.deltas, "both saw it")
            # the frame a channel subset gets is the full frame cut down, byte for byte
            subset = frozenset({"series"})
            for seq in range(first, end + 1):
                assert filter_delta(everything.deltas[seq], subset) == series.deltas[seq]
            # a resume on connect, plain and compressed, and a resume message
            q = f"?channels=series&resume_from={start}&epoch={hub.epoch}"
            plain = await _connect(ws_url(app) + q)
            packed = await _connect(ws_url(app) + q + "&compress=zlib")
            asked = await _connect(ws_url(app) + "?channels=series&compress=zlib")
            await _until(asked, lambda f: f.kind == p.SNAPSHOT)
            await asked.send(json.dumps({"type": "resume", "from": start}))
            for ws in (plain, packed):
                await _until(ws, lambda f: f.kind == p.CONFIG)
            for ws in (plain, packed, asked):
                for seq in range(start, end + 1):
                    data = await asyncio.wait_for(ws.recv(), 30)
                    while isinstance(data, str) or p.decode(data).seq != seq:
                        assert ws is asked, "a resume on connect starts at resume_from"
                        data = await asyncio.wait_for(ws.recv(), 30)
                    frame = p.decode(data)
                    live = p.decode(series.deltas[seq])
                    assert frame.kind == p.DELTA and frame.header == live.header
                    assert frame.columns == {} and "events" not in frame.header
                    assert "point" in frame.header
                    if ws is plain:
                        assert data == series.deltas[seq]  # the same bytes as live
                    else:
                        assert data[5] & p.FLAG_ZLIB or len(data) < p.COMPRESS_MIN_BYTES + 24
                await ws.close()
            await series.stop()
            await everything.stop()
            app.state.engine.check()

    asyncio.run(main())
