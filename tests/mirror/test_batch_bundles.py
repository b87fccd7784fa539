"""Batches queued while the engine worked go out together: one ``Batches``
message for many (each message is socket calls, each lets go of the
interpreter, and an engine that never waits for its passes gives it back only
after the switch interval), in order, within the size bound, a failure
counted -- and a mirror applies them as if each came alone, exact."""

from __future__ import annotations

import itertools
import threading

import msgspec
import pytest
import zmq

from blockpool.mirror import pool_digest
from blockpool.mirror import protocol as wire
from blockpool_vllm import sender as sender_mod
from blockpool_vllm.sender import Sender
from tests.app.conftest import free_port, running
from tests.mirror.rig import SECRET, Rig, exact_now, until
from tests.mirror.workload import FollowedEngine


class Pub:
    """A PUB socket's stand-in: what was published, frame by frame (and,
    from ``fail_at`` on, a socket that refuses)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.messages: list[list[bytes]] = []
        self.fail_at = fail_at

    def send_multipart(self, frames: list[bytes]) -> None:
        if self.fail_at is not None and len(self.messages) >= self.fail_at:
            raise zmq.ZMQError(zmq.EAGAIN)
        self.messages.append(frames)

    def batches(self) -> list[list[wire.Batch]]:
        """Each message's batches (a ``Batch`` alone: a list of one)."""
        out = []
        for topic, payload, mac in self.messages:
            assert topic == wire.TOPIC and SECRET.verify(mac, wire.TOPIC, payload)
            batches = wire.batches_of(wire.decode(payload, wire.MAX_BATCH_BYTES))
            assert batches
            out.append(batches)
        return out


def queued(steps: int, max_queue: int = 4096) -> tuple[FollowedEngine, Sender]:
    """An engine whose ``steps`` batches wait in a (keyed, not started) sender's queue."""
    engine = FollowedEngine(num_blocks=128)
    sender = Sender(
        f"tcp://127.0.0.1:{free_port()}",
        engine.hello,
        engine.follower.poll_snapshot,
        engine.stats,
        prepare=engine.follower.prepare,
        key=SECRET,
        max_queue=max_queue,
    )
    engine.send = sender.offer
    engine.drive(steps)
    assert sender._queue.qsize() == min(steps, max_queue) and engine.follower.seq == steps
    return engine, sender


def send_queued(sender: Sender, pub: Pub) -> None:
    sender._send_batches(pub, sender._queue.get_nowait())


def test_what_queued_goes_out_in_one_message_in_order() -> None:
    engine, sender = queued(10)
    pub = Pub()
    send_queued(sender, pub)
    (got,) = pub.batches()
    assert [b.seq for b in got] == list(range(1, 11))
    for before, after in itertools.pairwise(got):  # no gap: op counts chained
        assert after.first_op == before.first_op + len(before.ops)
    assert sender.sent == 10 and sender.bundles == 1 and sender.dropped == 0
    assert sender.handled_seq == 10 and sender.handled_ops == engine.follower.op_count
    assert sender._queue.empty()
    engine.rt.check()


def test_a_lone_batch_is_a_batch_and_bundles_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, sender = queued(1)
    pub = Pub()
    send_queued(sender, pub)
    assert isinstance(wire.decode(pub.messages[0][1]), wire.Batch) and sender.bundles == 0
    monkeypatch.setattr(sender_mod, "_BUNDLE", 4)
    engine.drive(10)
    send_queued(sender, pub)
    assert [[b.seq for b in m] for m in pub.batches()[1:]] == [
        [2, 3, 4, 5],
        [6, 7, 8, 9],
        [10, 11],
    ]
    assert sender.sent == 11 and sender.bundles == 3 and sender.dropped == 0
    engine.rt.check()


def test_past_the_size_bound_each_batch_goes_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, sender = queued(6)
    # the bound, below what six of them encode to (and above what each does)
    waiting = [sender._queue.get_nowait() for _ in range(6)]
    for b in waiting:
        sender._queue.put(b)
    sizes = [len(wire.encode(b)) for b in waiting]
    monkeypatch.setattr(wire, "MAX_BATCH_BYTES", sum(sizes) - 1)
    pub = Pub()
    send_queued(sender, pub)
    assert [[b.seq for b in m] for m in pub.batches()] == [[i] for i in range(1, 7)]
    assert sender.sent == 6 and sender.bundles == 0 and sender.dropped == 0
    engine.rt.check()


def test_a_bundle_the_socket_refuses_is_dropped_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sender_mod, "_BUNDLE", 4)
    engine, sender = queued(10)
    pub = Pub(fail_at=1)  # the first message goes, the second is refused
    with pytest.raises(zmq.ZMQError):
        send_queued(sender, pub)
    assert [[b.seq for b in m] for m in pub.batches()] == [[1, 2, 3, 4]]
    assert sender.sent == 4 and sender.dropped == 4  # the mirror sees the gap (5..8)
    assert sender.handled_seq == 8  # a beat claims no more than was handled
    assert sender._queue.qsize() == 2  # the rest waits for the loop's next turn
    pub.fail_at = None
    send_queued(sender, pub)
    assert [b.seq for b in pub.batches()[-1]] == [9, 10] and sender.sent == 6
    engine.rt.check()


def test_decoding_refuses_an_empty_an_oversized_or_a_foreign_bundle() -> None:
    engine, sender = queued(2)
    batch = sender._queue.get_nowait()
    assert batch is not None
    assert wire.decode(wire.encode(wire.Batches([batch], batch.boot))) == wire.Batches(
        [batch], batch.boot
    )
    raw = msgspec.msgpack.encode
    for bad in (
        {"type": "batches", "batches": []},
        {"type": "batches", "batches": [msgspec.to_builtins(batch)] * 257},
        {"type": "batches", "batches": [msgspec.to_builtins(engine.hello())]},
    ):
        with pytest.raises(wire.ProtocolError):
            wire.decode(raw(bad))
    engine.rt.check()


@pytest.mark.anyio
async def test_a_mirror_applies_bundled_batches_and_stays_exact() -> None:
    rig = Rig("uncached_first", key=SECRET)
    held, go = threading.Event(), threading.Event()
    prepare = rig.sender._prepare

    def slow_first(batch: wire.Batch) -> wire.Batch:  # the sender's thread held once
        if not held.is_set():
            held.set()
            go.wait(60)
        return prepare(batch)

    rig.sender._prepare = slow_first
    rig.start()
    try:
        hello = await rig.hello()
        app, client = rig.service(hello)
        async with running(app):
            await until(lambda: rig.caught_up(client))
            rig.engine.drive(1)
            await until(held.is_set)
            rig.engine.drive(40)  # queued while the sender's thread is held
            go.set()
            await until(lambda: rig.caught_up(client))
            assert rig.sender.bundles >= 1 and rig.sender.dropped == 0
            assert rig.sender.sent == rig.engine.follower.seq
            assert client.status.gaps == 0 and client.status.bad_messages == 0
            await exact_now(rig, client)
            assert pool_digest(app.state.engine.pool) == pool_digest(rig.engine.rt.pool)
    finally:
        rig.close()
    rig.engine.rt.check()


@pytest.mark.anyio
async def test_a_plugin_of_a_newer_protocol_is_said() -> None:
    rig = Rig("uncached_first", key=SECRET)
    said = rig.engine.hello
    rig.engine.hello = lambda port=None: msgspec.structs.replace(  # type: ignore[method-assign]
        said(port), protocol=wire.PROTOCOL + 1
    )
    rig.start()
    try:
        hello = await rig.hello()
        assert hello.protocol == wire.PROTOCOL + 1
        app, client = rig.service(hello)
        async with running(app) as api:
            await until(lambda: client.status.hello is not None)
            st = await api.ok("GET", "/api/mirror")
            newer = f"protocol {wire.PROTOCOL + 1}, this mirror {wire.PROTOCOL}"
            assert newer in st["last_problem"]
            await exact_now(rig, client)  # what it can read, it follows
    finally:
        rig.close()
    rig.engine.rt.check()


def test_past_the_queue_bound_a_batch_is_dropped_and_counted() -> None:
    engine, sender = queued(7, max_queue=4)
    # the engine's 5th..7th batches found the queue full: dropped, counted on
    # both sides, and a beat claims no more than the last one handled
    assert sender.dropped == 3 and engine.follower.drops == 3
    assert sender.handled_seq == 7
    pub = Pub()
    send_queued(sender, pub)
    (got,) = pub.batches()
    assert [b.seq for b in got] == [1, 2, 3, 4]  # the mirror sees the gap (5..7)
    assert got[-1].drops == 0 and sender.sent == 4 and sender._queue.qsize() == 0
    engine.rt.check()
