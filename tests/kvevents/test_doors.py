"""The observer's doors, probed as a hostile client would (loopback only,
bounded in time): the token before any body is read, bodies and batches
bounded, the held hashes capped with a counted overflow, replayed seqs
checked against the live stream, repeated live messages skipped without
loss."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import msgpack

from app.observer.source import Source
from app.shared.settings import ObserverSettings
from blockpool import AllBlocksCleared, BlockStored, KVCacheEvent
from blockpool.kvevents.config import SourceSpec
from tests.kvevents.helpers import Workload, positional, truth
from tests.kvevents.observer_live import client, live_observer

TOKEN = "door-token-0123456789"
BIG = 50_000_000  # a 50 MB body, declared and never sent


def raw_post(port: int, path: str, headers: dict[str, str], timeout: float = 30.0) -> str:
    """Send a POST's head declaring a BIG body, none of the body, and return
    the response head: a server that reads the body first never answers."""
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {BIG}",
            "Content-Type: application/json"]  # fmt: skip
    head += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sock.sendall(b'{"hashes": [')  # the start of the body, then silence
        got = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in got:
            assert time.monotonic() < deadline, "no answer before the body"
            try:
                chunk = sock.recv(65536)
            except TimeoutError as exc:
                raise AssertionError("no answer before the body") from exc
            if not chunk:
                break
            got += chunk
        return got.decode("latin-1")


def status_of(response: str) -> int:
    m = re.match(r"HTTP/1\.1 (\d{3})", response)
    assert m, response[:200]
    return int(m[1])


def test_a_stranger_is_refused_before_the_body_and_a_big_body_before_it_is_read() -> None:
    async def main() -> None:
        async with live_observer(
            endpoints=["p=tcp://127.0.0.1:1"], token=TOKEN, max_body_bytes=64 * 1024
        ) as app:
            port = app.state.port
            # no token, a wrong one: 401 at once, the 50 MB never awaited
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                answer = await asyncio.to_thread(raw_post, port, "/api/fleet/prefixes", headers)
                assert status_of(answer) == 401, answer[:300]
                assert "www-authenticate: bearer" in answer.lower()
            # the right token: the declared size alone is refused (413)
            answer = await asyncio.to_thread(
                raw_post, port, "/api/fleet/prefixes", {"Authorization": f"Bearer {TOKEN}"}
            )
            assert status_of(answer) == 413, answer[:300]
            async with client(app, TOKEN) as h:
                # a streamed body over the limit (no Content-Length) is cut too
                async def chunks():  # type: ignore[no-untyped-def]
                    yield b'{"hashes": ["' + b"a" * 40_000
                    yield b"b" * 40_000 + b'"]}'

                r = await h.post("/api/fleet/prefixes", content=chunks())
                assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
                # a body under the limit is answered as before
                r = await h.post("/api/fleet/prefixes", json={"hashes": ["00000000000000ff"]})
                assert r.status_code == 200 and r.json()["query"]["blocks"] == 1
                assert (await h.get("/api/health")).json()["status"] == "ok"
            async with client(app) as anon:
                r = await anon.get("/api/fleet")
                assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
                assert (await anon.get("/metrics")).status_code == 401
                assert (await anon.get("/api/health")).status_code == 200  # liveness stays open

    asyncio.run(asyncio.wait_for(main(), 120))


def source(**kw: object) -> Source:
    spec = SourceSpec("s", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", 0)
    return Source(spec, **kw)  # type: ignore[arg-type]


def stored(hashes: list[int], parent: int | None = None) -> BlockStored:
    return BlockStored(
        block_hashes=hashes, parent_block_hash=parent, token_ids=[7] * (2 * len(hashes)),
        block_size=2, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip


def test_a_duplicated_live_seq_is_skipped_and_the_state_kept() -> None:
    w = Workload(seed=201)
    batches = w.batches(12)
    p = [positional(b) for b in batches]
    s = source()
    for i in range(8):
        assert s.feed_live(i, p[i]) is None
    before = s.state.copies()
    assert before == truth(batches[:8]) and s.tracker.exact
    # the same message again, the newest and an older one
    assert s.feed_live(7, p[7]) is None
    assert s.feed_live(5, p[5]) is None
    t = s.tracker
    assert (t.restarts, s.resets, t.live_duplicates) == (0, 0, 2)
    assert s.state.copies() == before and t.exact
    for i in range(8, 12):  # and the stream carries on from where it was
        s.feed_live(i, p[i])
    assert s.state.copies() == truth(batches) and t.exact and t.applied == 11
    s.state.check()
    health = s.health()
    assert health["live_duplicates"] == 2 and health["restarts"] == 0
    w.check()


def test_a_replayed_seq_far_past_the_live_stream_cannot_swallow_later_batches() -> None:
    w = Workload(seed=202)
    batches = w.batches(8)
    p = [positional(b) for b in batches]
    s = source()
    t = s.tracker
    s.feed_live(0, p[0])
    assert s.feed_live(3, p[3]) == 1  # gap: replay from 1
    s.feed_live(4, p[4])
    # the replay answers with a seq the publisher cannot have sent
    assert t.on_replay((1 << 64) - 2, p[1]) is None
    assert t.replay_out_of_range == 1 and not t.replaying
    assert t.applied == 4  # what was buffered got applied; nothing bogus
    for i in (5, 6, 7):  # the live batches after it are applied, not duplicates
        s.feed_live(i, p[i])
    assert t.applied == 7 and t.duplicates == 0
    want = truth([batches[0], *batches[3:]])
    assert s.state.copies() == want and not t.exact  # 1..2 lost, and said so
    assert t.reason == "batches 1..2 were lost" and t.missed == 2
    s.state.check()
    w.check()


def test_a_replay_within_the_live_range_still_runs_ahead() -> None:
    w = Workload(seed=203)
    batches = w.batches(6)
    p = [positional(b) for b in batches]
    s = source()
    t = s.tracker
    s.feed_live(0, p[0])
    assert s.feed_live(2, p[2]) == 1
    for q in range(1, 6):  # past the newest live seq (2), within reach
        t.on_replay(q, p[q])
    assert t.on_replay_end() is None
    for i in (3, 4, 5):  # their live copies: duplicates
        s.feed_live(i, p[i])
    assert s.state.copies() == truth(batches) and t.exact and t.replay_out_of_range == 0
    w.check()


def test_the_held_hashes_are_capped_and_the_overflow_counted() -> None:
    s = source(max_hashes=10)
    batch: list[KVCacheEvent] = [stored(list(range(1, 26)))]
    s.feed_live(0, positional(batch))
    st = s.state
    assert len(st.entries) == 10 and st.blocks == 10 and st.overflow == 15
    assert set(st.entries) == set(range(1, 11))  # the first kept, the rest counted
    st.check()
    t = s.tracker
    assert not t.exact and "cap of 10 held hashes" in (t.reason or "")
    health = s.health()
    assert health["overflow_blocks"] == 15 and health["max_keys"] == 10
    # a copy of a held hash still counts; a clear makes the pool exact again
    s.feed_live(1, positional([stored([3])]))
    assert st.entries[3].copies == 2 and st.overflow == 15
    s.feed_live(2, positional([AllBlocksCleared(), stored([40, 41])]))
    assert st.copies() == {40: 1, 41: 1} and t.exact
    st.check()


def test_a_batch_over_a_count_limit_is_refused_whole() -> None:
    s = source(max_batch_hashes=100, max_batch_events=10, max_batch_tokens=300)
    s.feed_live(0, positional([stored([1, 2])]))
    # over each limit in turn: 101 hashes in two events; 11 events; 320 tokens
    s.feed_live(1, positional([stored(list(range(10, 60))), stored(list(range(60, 111)))]))
    s.feed_live(2, positional([stored([200 + i]) for i in range(11)]))
    wide = BlockStored(
        block_hashes=list(range(300, 340)), parent_block_hash=None, token_ids=[5] * 320,
        block_size=8, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip
    s.feed_live(3, positional([wide]))  # 40 hashes, 320 tokens
    t = s.tracker
    assert s.state.copies() == {1: 1, 2: 1}
    assert s.poison.counts == {"too_many_hashes": 1, "too_many_events": 1, "too_many_tokens": 1}
    assert t.decode_errors == 3 and not t.exact
    s.feed_live(4, positional([stored([3])]))  # the next good batch is applied
    assert s.state.copies() == {1: 1, 2: 1, 3: 1}
    s.state.check()


def test_the_count_limits_leave_other_decoders_alone() -> None:
    """decode_batch without limits (other users of the codec) reads it all."""
    from blockpool.kvevents.decode import decode_batch

    payload = positional([stored(list(range(1, 5001)))])
    assert len(decode_batch(payload).events[0].hashes) == 5000  # type: ignore[union-attr]


def test_the_default_batch_limits_bound_one_message() -> None:
    """An observer with the defaults refuses what a vLLM step never sends:
    a 12.5 MB payload unread, 200,000 one-byte hashes or 100,000 events
    before they are read."""
    cfg = ObserverSettings()
    s = source(max_batch_bytes=cfg.max_batch_bytes, max_batch_hashes=cfg.max_batch_hashes,
               max_batch_events=cfg.max_batch_events, max_batch_tokens=cfg.max_batch_tokens,
               max_hashes=cfg.max_hashes)  # fmt: skip
    huge = msgpack.packb([1.0, [["BlockRemoved", [1] * 200_000, "GPU"]], 0])
    s.feed_live(0, huge)
    many = msgpack.packb([1.0, [["AllBlocksCleared"]] * 100_000, 0])
    s.feed_live(1, many)
    s.feed_live(2, b"\x00" * 12_500_000)
    assert s.poison.counts == {"too_many_hashes": 1, "too_many_events": 1, "too_large": 1}
    assert s.state.copies() == {} and s.tracker.decode_errors == 3
