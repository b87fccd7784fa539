"""The plugin's sender against hostile peers: nothing sent to its ports, no
flood and no squatted port silences the stream or reaches the engine.

The engine is ``FollowedEngine`` (a blockpool pool followed as the plugin
follows vLLM's), stepped on the test's thread; the sender is the plugin's
own, on its own thread.  Waits are on conditions (generous bounds: the
machine may be loaded), never on time.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from blockpool.mirror import protocol as wire
from blockpool.mirror.auth import StreamKey
from blockpool.mirror.poolview import snapshot_digest
from blockpool_vllm.sender import Sender
from tests.app.conftest import free_port
from tests.mirror.workload import FollowedEngine
from tests.support.wait import eventually

WAIT = 120.0  # a bound on a stuck wait, not a timing check


class Subscriber:
    """A SUB on the sender's stream, reading every message in order."""

    def __init__(self, ctx: Any, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, wire.TOPIC)
        self.sock.connect(endpoint)
        self.frames: list[list[bytes]] = []  # every message read, its frames

    def next(self, timeout: float = WAIT) -> wire.Message:
        assert self.sock.poll(int(timeout * 1000)), "nothing on the stream"
        frames = self.sock.recv_multipart()
        assert len(frames) == 3 and frames[0] == wire.TOPIC, frames[:2]
        self.frames.append(frames)
        return wire.decode(frames[1])

    def until(self, pred: Any, what: str, timeout: float = WAIT) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.next(timeout)
            if pred(msg):
                return msg
        raise AssertionError(f"no {what} on the stream")

    def batch(self, seq: int) -> wire.Batch:
        """Reads up to the batch numbered ``seq`` (every one before it in order)."""
        seen = 0
        while True:
            for batch in wire.batches_of(self.next()):
                assert batch.seq > seen, (batch.seq, seen)
                seen = batch.seq
                if batch.seq >= seq:
                    assert batch.seq == seq
                    return batch


class Rig:
    def __init__(self, num_blocks: int = 64, key: StreamKey | None = None, **kw: Any) -> None:
        self.engine = FollowedEngine(num_blocks=num_blocks)
        self.engine.drive(10)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.control = f"tcp://127.0.0.1:{free_port()}"
        kw.setdefault("capture", self.engine.follower.poll_snapshot)
        self.sender = Sender(
            self.endpoint,
            self.engine.hello,
            stats=self.engine.stats,
            cost_us=self.engine.follower.cost_quantiles,
            control_endpoint=self.control,
            key=key,
            **kw,
        )
        self.engine.send = self.sender.offer
        self.ctx = zmq.Context()
        self.sub = Subscriber(self.ctx, self.endpoint)
        self.dealers: list[Any] = []

    def close(self) -> None:
        self.sender.close()
        for d in self.dealers:
            d.close(0)
        self.sub.sock.close(0)
        self.ctx.destroy(0)

    def start(self) -> None:
        assert self.sender.start()
        self.sub.until(lambda m: isinstance(m, wire.Hello), "a hello")  # subscribed

    def dealer(self, linger: int = 0, **opts: int) -> Any:
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, linger)
        for name, value in opts.items():
            d.setsockopt(getattr(zmq, name), value)
        d.connect(self.control)
        self.dealers.append(d)
        return d

    def step_seen(self) -> wire.Batch:
        """Engine steps until one makes a batch; that batch read from the stream."""
        seq = self.engine.follower.seq
        while self.engine.follower.seq == seq:
            self.engine.step()
        return self.sub.batch(self.engine.follower.seq)

    def request(self, key: StreamKey | None = None, **kw: Any) -> tuple[bytes, bytes, bytes]:
        """A snapshot request's frames: payload, mac (and its nonce)."""
        kw.setdefault("ts", time.time())
        kw.setdefault("nonce", os.urandom(16))
        payload = wire.encode(wire.SnapshotRequest(reason="test", **kw))
        mac = key.sign(b"snapshot?", payload) if key is not None else b""
        return payload, mac, kw["nonce"]


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    r.start()
    try:
        yield r
    finally:
        r.close()


def proper_snapshot(r: Rig, dealer: Any, key: StreamKey | None = None) -> wire.Snapshot:
    payload, mac, nonce = r.request(key)
    dealer.send_multipart([payload, mac])
    assert dealer.poll(int(WAIT * 1000)), "no snapshot"
    reply = dealer.recv_multipart()
    assert len(reply) == 2
    snap = wire.decode(reply[0])
    assert isinstance(snap, wire.Snapshot)
    assert snapshot_digest(snap) == snap.digest  # a consistent copy of the pool
    if key is not None:
        assert key.verify(reply[1], b"snapshot", nonce, reply[0])
    else:
        assert reply[1] == b""
    return snap


def refused(sender: Sender, n: int) -> None:
    eventually(lambda: sender.bad_requests == n, WAIT, f"{n} requests refused")


# --------------------------------------------------------------- malformed


def test_any_shape_sent_to_the_control_port_is_dropped_and_counted(rig: Rig) -> None:
    deep = b"\x91" * 1500 + b"\xc0"  # msgpack: an array in an array ... 1,500 deep
    assert len(deep) < wire.MAX_CONTROL_BYTES
    junk = [
        [deep, b""],
        [b"\x81", b"\xa0"],  # a 2-byte request as two frames
        [b""],  # an empty frame
        [os.urandom(1024) for _ in range(10)],  # 10 KB of junk, ten frames
        [os.urandom(3000), os.urandom(3000), os.urandom(3000)],
        [wire.encode(rig.engine.hello()), b""],  # a message, not a request
        [b"\x92\xa9snapshot?\xc0", b""],  # the tag, the wrong fields
        [wire.encode(wire.SnapshotRequest()) + b"\x00", b""],  # trailing bytes
    ]
    dealer = rig.dealer()
    for n, frames in enumerate(junk, 1):
        dealer.send_multipart(frames)
        refused(rig.sender, n)
        assert rig.sender.alive
        rig.step_seen()  # the stream goes on
    # one frame over MAXMSGSIZE: libzmq cuts that peer off before a byte is read
    big = rig.dealer()
    big.send_multipart([os.urandom(10 * 1024), b""])
    rig.step_seen()
    # the same peer that sent all that still gets its snapshot, and nothing else:
    # the first reply it reads is the snapshot's
    proper_snapshot(rig, dealer)
    eventually(lambda: rig.sender.snapshots == 1, WAIT, "the reply counted")
    assert rig.sender.requests == 1
    assert rig.sender.restarts == 0 and rig.sender.alive
    rig.sub.until(
        lambda m: isinstance(m, wire.Beat | wire.Hello) and m.bad_requests == len(junk),
        "the refusals published",
    )


def test_a_failure_in_the_thread_restarts_it_and_is_published() -> None:
    failed: list[bool] = []
    r = Rig()

    def capture() -> wire.Snapshot | None:
        if not failed:
            failed.append(True)
            raise RuntimeError("a bug in the capture")
        return r.engine.follower.poll_snapshot()

    r.sender._capture = capture
    r.start()
    try:
        r.step_seen()
        proper_snapshot(r, r.dealer())  # asked before the failure, answered after it
        assert failed and r.sender.restarts == 1 and r.sender.alive
        r.sub.until(lambda m: isinstance(m, wire.Beat) and m.restarts == 1, "a beat")
        r.sub.until(lambda m: isinstance(m, wire.Hello) and m.restarts == 1, "a hello")
        for _ in range(3):
            r.step_seen()
    finally:
        r.close()


# ------------------------------------------------------------------- floods


def test_a_flood_of_requests_is_coalesced_and_never_starves_the_stream() -> None:
    r = Rig(num_blocks=1024, snapshot_every_s=2.0)
    r.start()
    began = time.monotonic()
    sent = 0
    try:
        deaf = [r.dealer(RCVHWM=1) for _ in range(2)]  # peers that never read
        for _ in range(20):  # 2,000 requests from peers that then leave
            peers = [r.dealer(linger=30_000) for _ in range(100)]
            for p in peers:
                payload, mac, _ = r.request()
                p.send_multipart([payload, mac])
                p.close()  # its request is delivered after the close
            sent += 100
            for d in deaf:
                d.send_multipart(list(r.request()[:2]))
            # the engine steps, and each step's batch is on the stream meanwhile
            for _ in range(3):
                r.step_seen()
        s = r.sender
        eventually(lambda: s.requests >= sent, WAIT, "every request read")
        eventually(lambda: s.waiting == 0, WAIT, "every request answered or dropped")
        elapsed = time.monotonic() - began
        assert s.requests == sent + 2 * 20 and s.bad_requests == 0
        # one capture serves every request waiting; at most one per interval
        assert 1 <= s.captures <= 1 + elapsed / s.snapshot_every_s
        assert s.captures * 50 <= s.requests
        # each request: answered, its reply dropped (the peer gone), or dropped
        # (superseded, stale, too many waiting)
        assert s.snapshots + s.replies_dropped + s.requests_dropped == s.requests
        assert s.requests_dropped >= sent - s.captures * s.max_waiting
        assert s.dropped == 0 and s.restarts == 0
        r.step_seen()
    finally:
        r.close()


def test_a_peer_that_never_reads_holds_at_most_a_few_replies() -> None:
    r = Rig(num_blocks=4096, snapshot_every_s=0.0)
    r.start()
    try:
        deaf = r.dealer(RCVHWM=1, RCVBUF=4096)
        s = r.sender

        def ask_until(n: int) -> bool:
            if s.waiting == 0:
                deaf.send_multipart(list(r.request()[:2]))
            return s.replies_dropped >= n

        eventually(lambda: ask_until(1), WAIT, "a reply its queue could not take")
        queued = s.snapshots
        eventually(lambda: ask_until(20), WAIT, "twenty replies dropped")
        # its queue stayed full: nothing more was queued for it, the engine's
        # memory holds at most SNDHWM replies (and the sockets' buffers) for it
        assert s.snapshots <= queued + s.binding.peer_hwm
        assert s.restarts == 0 and s.alive
        r.step_seen()
    finally:
        r.close()


# ------------------------------------------------------------ squatted ports


@pytest.mark.parametrize("which", ["stream", "control"])
def test_a_squatted_port_is_retried_until_it_is_free(which: str) -> None:
    r = Rig(retry_s=0.05)
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    port = int((r.endpoint if which == "stream" else r.control).rpartition(":")[2])
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        assert r.sender.start() is False  # no raise: not bound, retried
        s = r.sender
        assert s.alive and not s.binding.bound and s.binding.error
        # the engine runs on; its batches are dropped (and counted) meanwhile
        for _ in range(5):
            r.engine.step()
        eventually(lambda: s.dropped == 5, WAIT, "batches dropped while not bound")
        # many failed attempts leak no socket (the context allows 16)
        eventually(lambda: s.binding.failures >= 40, WAIT, "forty attempts")
        squatter.close()
        eventually(lambda: s.binding.bound, WAIT, "bound once the port is free")
        hello = r.sub.until(lambda m: isinstance(m, wire.Hello), "a hello")
        assert hello.control_port == int(r.control.rpartition(":")[2])
        r.step_seen()
        proper_snapshot(r, r.dealer())
    finally:
        squatter.close()
        r.close()


# ---------------------------------------------------------------------- auth


def test_a_keyed_stream_is_signed_and_refuses_unsigned_requests(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("a-shared-secret-of-the-operator\n")
    key = StreamKey.from_file(tmp_path / "token")
    other = StreamKey(b"somebody-else-entirely")
    r = Rig(key=key)
    r.start()
    try:
        hello = wire.decode(r.sub.frames[-1][1])
        assert isinstance(hello, wire.Hello) and hello.authenticated
        for _ in range(3):
            r.step_seen()
        r.sub.until(lambda m: isinstance(m, wire.Beat), "a beat")
        kinds = set()
        for topic, payload, mac in r.sub.frames:
            assert key.verify(mac, topic, payload) and not other.verify(mac, topic, payload)
            kinds.add(type(wire.decode(payload)))
        assert kinds == {wire.Hello, wire.Batch, wire.Beat}
        dealer = r.dealer()
        valid = r.request(key)
        bad = [
            list(r.request()[:2]),  # unsigned
            list(r.request(other)[:2]),  # another key
            list(r.request(key, ts=time.time() - 120)[:2]),  # stale
            list(r.request(key, ts=float("nan"))[:2]),
            list(r.request(key, nonce=b"")[:2]),  # no nonce
            [valid[0], valid[1][:-1] + bytes([valid[1][-1] ^ 1])],  # a flipped bit
            [valid[0] + b"\x00", valid[1]],
        ]
        for n, frames in enumerate(bad, 1):
            dealer.send_multipart(frames)
            refused(r.sender, n)
        dealer.send_multipart(list(valid[:2]))
        assert dealer.poll(int(WAIT * 1000))
        payload, mac = dealer.recv_multipart()  # the first reply: the valid request's
        assert key.verify(mac, b"snapshot", valid[2], payload)
        assert not other.verify(mac, b"snapshot", valid[2], payload)
        snap = wire.decode(payload)
        assert isinstance(snap, wire.Snapshot) and snapshot_digest(snap) == snap.digest
        dealer.send_multipart(list(valid[:2]))  # the same request again: a replay
        eventually(lambda: r.sender.bad_requests == len(bad) + 1, WAIT, "the replay")
        proper_snapshot(r, dealer, key)  # its next reply is the next request's
        eventually(lambda: r.sender.snapshots == 2, WAIT, "the replies counted")
    finally:
        r.close()
