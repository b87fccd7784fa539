"""Our ZMQ publisher read by a subscriber written to vLLM's documented
protocol, over loopback TCP: the events the engine emitted, contiguous
seqs, replays from a seq, bounded queues with drops counted."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import msgspec
import pytest
import zmq

from app.pool.engine import Engine, TickData
from app.shared.settings import Settings
from blockpool import BlockStored, KVEventBatch
from blockpool.kvevents.config import KVEventsConfig
from blockpool.kvevents.publisher import KVEventPublisher
from blockpool.kvevents.publisher_counts import PUBLISHER_HELP
from blockpool.kvevents.replay_frames import REPLAY_TOPIC, REPLAY_V016, replay_layout
from tests.kvevents.helpers import (
    END_SEQ,
    VllmSubscriber,
    engine_step,
    free_port,
    positional,
    wait_for,
)

STORED = BlockStored(
    block_hashes=[1, 2], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=2,
    lora_id=None, medium="GPU", lora_name=None,
)  # fmt: skip


def make_engine() -> Engine:
    return Engine(Settings(num_blocks=48, block_size=4, storage=False, hash_seed="0"))


def connect(pub: KVEventPublisher, topic: bytes = b"") -> tuple[VllmSubscriber, int]:
    """A subscriber that has seen one (poke) batch; returns the next seq."""
    assert pub.bound_endpoint is not None
    sub = VllmSubscriber(pub.bound_endpoint, pub.bound_replay_endpoint, topic)
    sub.wait_connected(lambda: pub.publish_events(0.0, []))
    # every poke sent (none still in the publisher's queue), then drained
    wait_for(lambda: pub.last_published_seq == pub._next_seq - 1)
    while sub.sub.poll(50):
        sub.recv(1)
    return sub, pub._next_seq


def test_engine_ticks_arrive_as_vllm_batches_with_contiguous_seqs() -> None:
    port = free_port()
    cfg = KVEventsConfig(
        # rank 2 moves both ports up by 2: give the ports 2 below free ones
        endpoint=f"tcp://127.0.0.1:{port - 2}",
        replay_endpoint=f"tcp://127.0.0.1:{free_port() - 2}",
        topic="kv@blockpool", data_parallel_rank=2, bind="bind",
    )  # fmt: skip
    # vLLM moves both ports up by the rank
    assert cfg.pub_endpoint == f"tcp://127.0.0.1:{port}"
    pub = KVEventPublisher(cfg)
    pub.start()
    engine = make_engine()
    emitted: list[TickData] = []
    try:
        assert pub.bound_endpoint == f"tcp://127.0.0.1:{port}"
        sub, first = connect(pub, b"kv@")
        pub.attach(engine)
        engine.listeners.append(lambda d: emitted.append(d) if d.events else None)
        rng = random.Random(4)
        prefixes = [[rng.randrange(40) for _ in range(rng.randint(4, 16))] for _ in range(4)]
        for _ in range(120):
            engine_step(engine, rng, prefixes)
            engine.tick()
        engine.tick()  # a tick without events publishes nothing
        got = sub.recv_n(len(emitted))
        assert not sub.sub.poll(200)
        assert len(emitted) > 50
        for i, ((topic, seq, batch), tick) in enumerate(zip(got, emitted, strict=True)):
            assert topic == b"kv@blockpool"
            assert seq == first + i
            assert batch.ts == tick.ts
            assert batch.data_parallel_rank == 2
            assert batch.events == [ev for _, _, ev in tick.events]
        m = pub.metrics()
        assert m["batches_published_total"] == first + len(emitted)
        assert m["events_published_total"] == sum(len(t.events) for t in emitted)
        assert m["batches_dropped_total"] == 0 and m["last_seq"] == first + len(emitted) - 1
        # the replay gives back the very bytes that were published
        replay = sub.replay(first)
        assert [s for s, _ in replay] == list(range(first, first + len(emitted)))
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        assert [decoder.decode(p) for _, p in replay] == [b for _, _, b in got]
        sub.close()
    finally:
        pub.stop()
    engine.check()


def test_replay_serves_exactly_the_buffered_batches_then_minus_one() -> None:
    pub = KVEventPublisher(
        KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                       buffer_steps=10)
    )  # fmt: skip
    pub.start()
    try:
        sub, first = connect(pub)
        for i in range(30):
            pub.publish_events(float(i), [STORED] * (i % 3 + 1))
        live = sub.recv_n(30)
        assert [s for _, s, _ in live] == list(range(first, first + 30))
        last = first + 29
        wait_for(lambda: pub.last_published_seq == last)
        # the buffer holds the last 10 batches
        assert [s for s, _ in sub.replay(0)] == list(range(last - 9, last + 1))
        assert [s for s, _ in sub.replay(last - 3)] == list(range(last - 3, last + 1))
        assert sub.replay(last + 1) == []  # nothing newer: only the end marker
        for seq, payload in sub.replay(last - 9):
            assert msgspec.msgpack.decode(payload, type=KVEventBatch) == live[seq - first][2]
        status = pub.status()
        assert status["buffer_first_seq"] == last - 9 and status["buffer_batches"] == 10
        assert status["replay_requests"] == 4
        assert pub.metrics()["buffer_evicted_total"] == first + 30 - 10
        sub.close()
    finally:
        pub.stop()


def test_bad_replay_requests_are_counted_and_answered_by_nothing() -> None:
    pub = KVEventPublisher(
        KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    )
    pub.start()
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        assert pub.bound_replay_endpoint is not None
        dealer.connect(pub.bound_replay_endpoint)
        dealer.send_multipart([b"", b"\x00\x01"])  # not 8 bytes
        dealer.send_multipart([b"x", (0).to_bytes(8, "big")])  # no empty delimiter
        wait_for(lambda: pub.counts.replay_invalid == 2)
        assert not dealer.poll(100)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert dealer.poll(5000)
        assert dealer.recv_multipart() == [b"", END_SEQ, b""]
    finally:
        dealer.close(linger=0)
        ctx.term()
        pub.stop()


class _Stalled(KVEventPublisher):
    """A publisher whose thread stalls in its first send after ``armed`` is
    set, until released."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.armed = threading.Event()
        self.release = threading.Event()
        self.stalled = threading.Event()

    def _send(self, pub: Any, item: Any) -> None:
        if self.armed.is_set() and not self.stalled.is_set():
            self.stalled.set()
            self.release.wait(10)
        super()._send(pub, item)


def test_a_full_queue_drops_batches_counts_them_and_leaves_a_seq_gap() -> None:
    pub = _Stalled(
        KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                       max_queue_size=3)
    )  # fmt: skip
    pub.start()
    try:
        assert pub.bound_endpoint is not None
        sub, first = connect(pub)  # subscribed (pokes until one arrives): seqs from `first`
        pub.armed.set()
        engine = make_engine()
        pub.attach(engine)
        pub.publish_events(0.0, [STORED])  # `first`: taken by the thread, which stalls
        assert pub.stalled.wait(5)
        wait_for(lambda: pub._queue.qsize() == 0)
        t0 = time.monotonic()
        for i in range(10):  # first+1..first+3 queued, first+4..first+10 dropped
            pub.on_tick(TickData(i, float(i), None, [(i, 0.0, STORED)], [], {}, False))  # type: ignore[arg-type]
        # the engine never waited: a blocking put would wait for the release (10 s)
        assert time.monotonic() - t0 < 5
        assert (pub.counts.batches_dropped, pub.counts.events_dropped, pub._queue.qsize()) == (
            7,
            7,
            3,
        )
        pub.release.set()
        wait_for(lambda: pub.last_published_seq == first + 3)
        pub.publish_events(11.0, [STORED])  # first + 11
        try:
            got = [s - first for _, s, _ in sub.recv_n(5)]
            assert got == [0, 1, 2, 3, 11]  # the drops show as a gap
            assert [s - first for s, _ in sub.replay(first + 4)] == [11]  # no replay fills it
        finally:
            sub.close()
        m = pub.metrics()
        assert (m["batches_dropped_total"], m["events_dropped_total"]) == (7, 7)
        assert m["queue_capacity_batches"] == 3
        # one set of counters: REST, /metrics (each with its HELP) and the attributes
        st = pub.status()
        assert (st["batches_dropped"], st["events_dropped"]) == (7, 7)
        assert st["batches_queued"] == m["batches_queued_total"] == pub.counts.batches_queued
        assert set(m) == set(PUBLISHER_HELP)
        pub.detach()
        assert pub.on_tick not in engine.listeners
    finally:
        pub.release.set()
        pub.stop()


def test_the_publisher_connects_to_a_concrete_address_like_vllm() -> None:
    """vLLM binds wildcard addresses and connects to concrete ones (the
    subscriber binds): the publisher then dials out."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = free_port()
    sub.bind(f"tcp://127.0.0.1:{port}")
    pub = KVEventPublisher(KVEventsConfig(endpoint=f"tcp://127.0.0.1:{port}"))
    pub.start()
    try:
        assert not pub.config.binds()
        deadline = time.monotonic() + 10
        while not sub.poll(100):
            assert time.monotonic() < deadline
            pub.publish_events(1.0, [STORED])
        topic, seq, payload = sub.recv_multipart()
        assert (topic, len(seq)) == (b"", 8)
        assert msgspec.msgpack.decode(payload, type=KVEventBatch).events == [STORED]
        assert payload == positional([STORED], ts=1.0, rank=0)
    finally:
        pub.stop()
        sub.close(linger=0)
        ctx.term()


def test_bind_failures_surface_at_start_and_stop_leaves_no_thread() -> None:
    a = KVEventPublisher(KVEventsConfig(endpoint="tcp://127.0.0.1:*"))
    a.start()
    try:
        assert a.bound_endpoint is not None
        b = KVEventPublisher(KVEventsConfig(endpoint=a.bound_endpoint, bind="bind"))
        with pytest.raises(RuntimeError, match="KV-event publisher"):
            b.start()
        assert not b.running
        with pytest.raises(RuntimeError, match="not running"):
            b.publish_events(0.0, [STORED])
    finally:
        a.stop()
    a.stop()  # twice is fine
    assert not a.running
    assert not [t for t in threading.enumerate() if t.name == "kv-event-publisher"]
    with pytest.raises(RuntimeError, match="not running"):
        a.publish_events(0.0, [STORED])


def test_events_gone_from_the_engine_log_before_a_tick_are_a_counted_seq_gap() -> None:
    pub = KVEventPublisher(
        KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    )
    pub.start()
    engine = Engine(
        Settings(num_blocks=400, block_size=4, storage=False, hash_seed="0", event_log_capacity=100)
    )
    try:
        sub, first = connect(pub)
        pub.attach(engine)
        seen: list[TickData] = []
        engine.listeners.append(seen.append)
        rng = random.Random(9)
        prefixes = [[rng.randrange(40) for _ in range(rng.randint(4, 16))] for _ in range(6)]
        while engine.events.last_seq < 130:  # more than the log holds, no tick between
            engine_step(engine, rng, prefixes)
        emitted = engine.events.last_seq
        data = engine.tick()
        assert data is seen[-1]
        assert data.events_lost == emitted - 100 and len(data.events) == 100
        assert [s for s, _, _ in data.events] == list(range(emitted - 99, emitted + 1))
        # the lost events' batch is a gap; the survivors come next
        (_, seq, batch) = sub.recv()
        assert seq == first + 1
        assert batch.events == [ev for _, _, ev in data.events]
        m = pub.metrics()
        assert (m["batches_dropped_total"], m["events_dropped_total"]) == (1, emitted - 100)
        assert engine.events_lost_to_ticks == emitted - 100
        # the next tick loses nothing
        engine_step(engine, rng, prefixes)
        assert engine.tick().events_lost == 0
        sub.close()
    finally:
        pub.stop()
    engine.check()


def test_map_form_round_trips_through_the_observer_decoder() -> None:
    """--kv-events-format map: vLLM >= 0.24's map-tagged events; the
    observer's decoder reads them back, the new fields as extras."""
    from blockpool import AllBlocksCleared, BlockRemoved
    from blockpool.kvevents.decode import decode_batch
    from blockpool.kvevents.observed import RemovedEvent, StoredEvent
    from blockpool.kvevents.wire_format import encode_map_batch

    lora = BlockStored([7, (1 << 64) - 1], 3, [9, 8, 7, 6], 2, 5, "GPU", "sql")
    evs = [STORED, lora, BlockRemoved([1], "GPU"), AllBlocksCleared()]
    raw = msgspec.msgpack.decode(encode_map_batch(4.5, evs, 1, 0))
    assert raw[0] == 4.5 and raw[2] == 1
    assert raw[1][0] == {
        "type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": None, "medium": "GPU",
        "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention",
    }  # fmt: skip
    removed = {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 0}
    assert raw[1][2] == removed
    assert raw[1][3] == {"type": "AllBlocksCleared"}
    got = decode_batch(encode_map_batch(4.5, evs, 1, 0))
    assert (got.ts, got.data_parallel_rank, got.encoding) == (4.5, 1, "map")
    assert (got.unknown, got.malformed) == (0, 0)
    s0, s1, rm = got.events[0], got.events[1], got.events[2]
    assert isinstance(s0, StoredEvent) and isinstance(s1, StoredEvent)
    assert (s0.hashes, s0.parent, s0.token_ids, s0.block_size) == ([1, 2], None, [1, 2, 3, 4], 2)
    # the observer reads the group fields into the event (its state is per group)
    assert (s0.group, s0.spec_kind, s0.sliding_window, s0.extra) == (
        0,
        "full_attention",
        None,
        None,
    )
    assert (s1.hashes, s1.parent, s1.lora_id, s1.lora_name) == ([7, (1 << 64) - 1], 3, 5, "sql")
    assert isinstance(rm, RemovedEvent) and rm.hashes == [1] and (rm.group, rm.extra) == (0, None)
    assert len(got.events) == 4
    # several groups: the group is unknown, so it is left out
    no_group = msgspec.msgpack.decode(encode_map_batch(1.0, [BlockRemoved([1], "GPU")], 0, None))
    assert no_group[1] == [{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}]


def test_the_publisher_sends_the_map_form_and_says_how_it_wires() -> None:
    from blockpool.kvevents.wire_format import encode_map_batch

    port = free_port()
    cfg = KVEventsConfig(endpoint=f"tcp://127.0.0.1:{port}", bind="bind", events_format="map")
    pub = KVEventPublisher(cfg)
    pub.start()
    try:
        st = pub.status()
        assert (st["mode"], st["bind_setting"], st["events_format"]) == ("bind", "bind", "map")
        sub, seq = connect(pub)  # its poke batches hold no event: alike in both forms
        pub.publish_events(2.0, [STORED])
        assert sub.sub.poll(10_000)
        _, seq_bytes, payload = sub.sub.recv_multipart()
        assert int.from_bytes(seq_bytes, "big") == seq
        assert payload == encode_map_batch(2.0, [STORED], 0, None)  # no engine: no group
        assert msgspec.msgpack.decode(payload)[1][0]["type"] == "BlockStored"
        pub.attach(make_engine())  # a one-group engine: group 0 from now on
        pub.publish_events(3.0, [STORED])
        assert sub.sub.poll(10_000)
        assert sub.sub.recv_multipart()[2] == encode_map_batch(3.0, [STORED], 0, 0)
        sub.close()
    finally:
        pub.stop()


def test_a_loopback_endpoint_under_auto_connects_and_the_log_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    pub = KVEventPublisher(KVEventsConfig(endpoint=f"tcp://127.0.0.1:{port}"))
    with caplog.at_level("INFO", logger="blockpool.kvevents"):
        pub.start()
    try:
        st = pub.status()
        assert (st["mode"], st["bind_setting"], st["binds"]) == ("connect", "auto", False)
        assert st["bound_endpoint"] == f"tcp://127.0.0.1:{port}"
        text = caplog.text
        assert f"KV events: PUB connect tcp://127.0.0.1:{port}" in text
        assert "a subscriber must bind this address" in text
    finally:
        pub.stop()


@pytest.mark.parametrize(("events_format", "frames"), [("v016", 3), ("map", 4)])
def test_the_replay_is_laid_out_as_the_release_the_form_speaks_for(
    events_format: str, frames: int
) -> None:
    """vLLM 0.16's replies are three frames; the current vLLM's (the "map"
    form) four, the topic before the seq and an empty one on the end marker --
    and the observer reads both."""
    port, replay_port = free_port(), free_port()
    cfg = KVEventsConfig(
        endpoint=f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
        bind="bind", events_format=events_format, topic="kv",  # type: ignore[arg-type]
    )  # fmt: skip
    pub = KVEventPublisher(cfg)
    pub.start()
    try:
        sub, first = connect(pub, topic=b"kv")
        pub.publish_events(2.0, [STORED])
        assert sub.sub.poll(10_000)
        sub.sub.recv_multipart()
        replay = sub.replay(first)
        assert [s for s, _ in replay] == list(range(first, pub.last_published_seq + 1))
        assert sub.replay_frames == frames  # the end marker's layout
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        try:
            dealer.send_multipart([b"", pub.last_published_seq.to_bytes(8, "big")])
            assert dealer.poll(10_000)
            one = dealer.recv_multipart()
            assert replay_layout(one, b"kv") == {3: REPLAY_V016, 4: REPLAY_TOPIC}[frames]
            assert one[-1] == replay[-1][1] and (frames == 3 or one[1] == b"kv")
            assert dealer.poll(10_000)
            end = dealer.recv_multipart()
            assert end[-2] == END_SEQ and replay_layout(end, b"kv") == replay_layout(one, b"kv")
        finally:
            dealer.close(linger=0)
            ctx.term()
        sub.close()
    finally:
        pub.stop()
