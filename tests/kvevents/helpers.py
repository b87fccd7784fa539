"""Shared pieces of the KV-event tests: a seeded workload on a real pool, the
truth computed from an event sequence, both wire encodings, a minimal
subscriber written to vLLM's documented protocol, and a scriptable fake
publisher (PUB + ROUTER) for gap / replay / restart scenarios."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import msgspec
import zmq

import blockpool
from blockpool import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
    RequestManager,
)
from tests.support.ports import free_port as free_port  # re-exported for the tests here
from tests.support.ports import tcp_endpoint
from tests.support.wait import eventually, eventually_async

END_SEQ = (-1).to_bytes(8, "big", signed=True)


tcp = tcp_endpoint


# ------------------------------------------------------------------ workload


class Workload:
    """Seeded traffic on a real BlockPool through the RequestManager:
    shared prefixes, LoRA adapters, decode, finishes, evictions, resets.
    ``step()`` returns that step's events (one batch)."""

    def __init__(
        self, seed: int, num_blocks: int = 48, block_size: int = 4, lora: bool = True
    ) -> None:
        self.lora = lora
        self.rng = random.Random(seed)
        self.pool = BlockPool(
            num_blocks, enable_caching=True, hash_block_size=block_size,
            enable_kv_cache_events=True,
        )  # fmt: skip
        self.manager = RequestManager(self.pool, block_size)
        self.block_size = block_size
        rng = self.rng
        self.prefixes = [[rng.randrange(40) for _ in range(rng.randint(4, 20))] for _ in range(6)]
        self.running: list[str] = []
        self.n = 0

    def step(self) -> list[KVCacheEvent]:
        rng = self.rng
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            try:
                if r < 0.4 or not self.running:
                    self.n += 1
                    rid = f"r{self.n}"
                    toks = rng.choice(self.prefixes) + [
                        rng.randrange(40) for _ in range(rng.randint(0, 10))
                    ]
                    lora = rng.choice([None, None, None, "adapter-a"]) if self.lora else None
                    self.manager.admit(rid, toks, lora_name=lora, lora_id=7 if lora else 1)
                    self.running.append(rid)
                elif r < 0.65:
                    rid = rng.choice(self.running)
                    self.manager.append_tokens(rid, [rng.randrange(40) for _ in range(3)])
                elif r < 0.93:
                    rid = self.running.pop(rng.randrange(len(self.running)))
                    self.manager.finish(rid)
                elif r < 0.97:
                    self.pool.evict_blocks([rng.randrange(1, self.pool.num_gpu_blocks)])
                elif not self.running:
                    self.pool.reset_prefix_cache()
            except blockpool.NotEnoughBlocksError:
                pass
        blockpool.check_invariants(self.pool)
        return self.pool.take_events()

    def batches(self, n: int) -> list[list[KVCacheEvent]]:
        """``n`` non-empty batches."""
        out = []
        while len(out) < n:
            evs = self.step()
            if evs:
                out.append(evs)
        return out

    def check(self) -> None:
        blockpool.check_invariants(self.pool)

    def pool_copies(self) -> dict[int, int]:
        """The pool's real hash map as events show it: 64-bit hash -> blocks."""
        out: dict[int, int] = {}
        for key, blocks in self.pool.cached_block_hash_to_block.iter_entries():
            h = int.from_bytes(key[-12:-4], "big")
            out[h] = out.get(h, 0) + len(blocks)
        return out


def truth(batches: list[list[KVCacheEvent]]) -> dict[Any, int]:
    """hash -> copies, computed from the event sequence alone."""
    held: dict[Any, int] = {}
    for evs in batches:
        for ev in evs:
            if isinstance(ev, BlockStored):
                for h in ev.block_hashes:
                    held[h] = held.get(h, 0) + 1
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    if held.get(h, 0) > 1:
                        held[h] -= 1
                    else:
                        held.pop(h, None)
            elif isinstance(ev, AllBlocksCleared):
                held.clear()
    return held


# ------------------------------------------------------------------ encodings


def positional(evs: list[KVCacheEvent], ts: float = 1.0, rank: int | None = 0) -> bytes:
    return blockpool.encode_event_batch(KVEventBatch(ts=ts, events=evs, data_parallel_rank=rank))  # type: ignore[arg-type]


def map_tagged(
    evs: list[KVCacheEvent], ts: float = 1.0, rank: int | None = 0, as_bytes: bool = False
) -> bytes:
    """The same batch as maps tagged by "type" (newer vLLM / SGLang style),
    with fields we do not know, and hashes as bytes when ``as_bytes``."""

    def h(x: Any) -> Any:
        return x.to_bytes(8, "big") if as_bytes and isinstance(x, int) else x

    out = []
    for ev in evs:
        if isinstance(ev, BlockStored):
            out.append(
                {
                    "type": "BlockStored",
                    "block_hashes": [h(x) for x in ev.block_hashes],
                    "parent_block_hash": h(ev.parent_block_hash),
                    "token_ids": ev.token_ids,
                    "block_size": ev.block_size,
                    "lora_id": ev.lora_id,
                    "medium": ev.medium,
                    "lora_name": ev.lora_name,
                    "extra_keys": [["mm-hash", 3]],
                    "group_idx": 0,
                }
            )
        elif isinstance(ev, BlockRemoved):
            out.append(
                {"type": "BlockRemoved", "block_hashes": [h(x) for x in ev.block_hashes],
                 "medium": ev.medium, "group_idx": 0}
            )  # fmt: skip
        else:
            out.append({"type": "AllBlocksCleared"})
    return msgpack.packb({"ts": ts, "events": out, "data_parallel_rank": rank})


def vllm_current(
    evs: list[KVCacheEvent], group: int | None = 0, kind: str = "full_attention",
    window: int | None = None, ts: float = 1.0, rank: int | None = 0,
    unknown: dict[str, Any] | None = None,
) -> bytes:  # fmt: skip
    """The batch as current vLLM (>= 0.24, checked against 0.33's
    ``kv_events.py``) encodes it: an array ``[ts, events, rank]`` whose events
    are maps tagged by "type" (msgspec ``tag=True``, ``omit_defaults``) with
    the KV-cache group and, on BlockStored, its cache spec; ``unknown``
    adds fields no release sends to every event."""
    out: list[dict[str, Any]] = []
    for ev in evs:
        if isinstance(ev, BlockStored):
            m: dict[str, Any] = {
                "type": "BlockStored", "block_hashes": list(ev.block_hashes),
                "parent_block_hash": ev.parent_block_hash, "token_ids": list(ev.token_ids),
                "block_size": ev.block_size, "lora_id": ev.lora_id, "medium": ev.medium,
                "lora_name": ev.lora_name, "extra_keys": [None] * len(ev.block_hashes),
            }  # fmt: skip
            if group is not None:
                m.update(group_idx=group, kv_cache_spec_kind=kind)
                if window is not None:
                    m["kv_cache_spec_sliding_window"] = window
        elif isinstance(ev, BlockRemoved):
            m = {"type": "BlockRemoved", "block_hashes": list(ev.block_hashes), "medium": ev.medium}
            if group is not None:
                m["group_idx"] = group
        else:
            m = {"type": "AllBlocksCleared"}
        if unknown and m["type"] != "AllBlocksCleared":
            m.update(unknown)
        out.append(m)
    return msgpack.packb([ts, out, rank])


def as_bytes_truth(t: dict[Any, int]) -> dict[Any, int]:
    return {k.to_bytes(8, "big"): v for k, v in t.items()}


# ------------------------------------------------------------------ subscriber


class VllmSubscriber:
    """A subscriber written to vLLM's documented protocol (its
    kv_events_subscriber example): SUB frames (topic, 8-byte big-endian seq,
    msgpack KVEventBatch), gaps detected by seq, missed batches asked from
    the ROUTER by sending the start seq; replies (seq, payload) end with seq
    -1 and an empty payload.  A DEALER stands in for the example's REQ: a
    REQ socket takes only the first reply of a multi-message answer."""

    def __init__(self, endpoint: str, replay: str | None = None, topic: bytes = b"") -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay
        self.replay_frames: int | None = None  # frames of the last replay reply
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.received: list[tuple[bytes, int, KVEventBatch]] = []

    def wait_connected(self, publish: Callable[[], Any], timeout: float = 10.0) -> None:
        """PUB/SUB drops what is sent before the subscription arrives: poke
        until one message gets through (the caller discards it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            publish()
            if self.sub.poll(100):
                self.recv(timeout=1)
                while self.sub.poll(50):
                    self.recv(timeout=1)
                return
        raise AssertionError("the subscriber never received anything")

    def recv(self, timeout: float = 10.0) -> tuple[bytes, int, KVEventBatch]:
        if not self.sub.poll(int(timeout * 1000)):
            raise AssertionError("no message within the timeout")
        topic, seq_bytes, payload = self.sub.recv_multipart()
        assert len(seq_bytes) == 8
        item = (topic, int.from_bytes(seq_bytes, "big"), self.decoder.decode(payload))
        self.received.append(item)
        return item

    def recv_n(self, n: int, timeout: float = 10.0) -> list[tuple[bytes, int, KVEventBatch]]:
        return [self.recv(timeout) for _ in range(n)]

    def replay(self, start: int, timeout: float = 10.0) -> list[tuple[int, bytes]]:
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            out: list[tuple[int, bytes]] = []
            while True:
                if not dealer.poll(int(timeout * 1000)):
                    raise AssertionError("the replay did not end")
                frames = dealer.recv_multipart()
                self.replay_frames = len(frames)  # 3: vLLM 0.16's layout, 4: vLLM >= 0.24's
                empty, seq_bytes, payload = frames[0], frames[-2], frames[-1]
                assert empty == b"" and len(frames) in (3, 4)
                if seq_bytes == END_SEQ:
                    assert payload == b""
                    return out
                out.append((int.from_bytes(seq_bytes, "big"), payload))
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()


# ------------------------------------------------------------------ fake publisher


class FakePublisher:
    """A PUB + ROUTER the test scripts: ``send(seq, payload)`` publishes any
    seq; the ROUTER serves ``self.buffer`` (seq -> payload) from a requested
    seq, after ``replay_delay`` and optionally ``during_replay()`` (to race
    live messages against the replay).  ``serve_replays=False`` leaves
    requests unanswered (timeouts).  ``replay_layout``: ``"v016"`` answers
    as vLLM 0.16 does (``b""``, seq, payload), ``"topic"`` as vLLM 0.24 on
    (``b""``, topic, seq, payload; the end marker's topic empty)."""

    def __init__(
        self, topic: bytes = b"", endpoint: str | None = None, replay_layout: str = "v016"
    ) -> None:
        self.replay_layout = replay_layout
        self.ctx = zmq.Context()
        # an XPUB is a PUB that also hears subscriptions: wait_subscribed()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.subscriptions = 0
        self.endpoint = endpoint or tcp()
        self.pub.bind(self.endpoint)
        self.replay_endpoint = tcp()
        self.topic = topic
        self.buffer: dict[int, bytes] = {}
        self.requests: list[int] = []
        self.serve_replays = True
        self.replay_delay = 0.0
        self.during_replay: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._router_ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._router_ready.wait(5)

    def send(self, seq: int, payload: bytes, keep: bool = True) -> None:
        with self._lock:
            if keep:
                self.buffer[seq] = payload
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def wait_subscribed(self, n: int = 1, timeout: float = 10.0) -> None:
        """Until ``n`` subscriptions reached the socket (PUB/SUB drops what is
        sent before that: the "slow joiner")."""
        deadline = time.monotonic() + timeout
        while self.subscriptions < n:
            if time.monotonic() > deadline:
                raise AssertionError("no subscriber subscribed")
            with self._lock:
                if self.pub.poll(10) and self.pub.recv()[:1] == b"\x01":
                    self.subscriptions += 1
            time.sleep(0.001)

    def record(self, seq: int, payload: bytes) -> None:
        """Keep a batch for replay without sending it live (a lost message)."""
        with self._lock:
            self.buffer[seq] = payload

    def _serve(self) -> None:
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.replay_endpoint)
        self._router_ready.set()
        try:
            while not self._stop.is_set():
                if not router.poll(20):
                    continue
                client, _, start = router.recv_multipart()
                seq = int.from_bytes(start, "big")
                self.requests.append(seq)
                if not self.serve_replays:
                    continue
                if self.replay_delay:
                    time.sleep(self.replay_delay)
                with self._lock:
                    items = sorted((s, p) for s, p in self.buffer.items() if s >= seq)
                if self.during_replay is not None:
                    self.during_replay()
                topic = [self.topic] if self.replay_layout == "topic" else []
                end = [b""] if self.replay_layout == "topic" else []
                for s, p in items:
                    router.send_multipart([client, b"", *topic, s.to_bytes(8, "big"), p])
                router.send_multipart([client, b"", *end, END_SEQ, b""])
        finally:
            router.close(linger=0)

    def restart(self) -> None:
        """A new publisher process: the buffer is empty, seqs start again."""
        with self._lock:
            self.buffer.clear()

    def close(self) -> None:
        if self.ctx.closed:
            return
        self._stop.set()
        self._thread.join(5)
        self.pub.close(linger=0)
        self.ctx.term()


@contextmanager
def fake_publisher(topic: bytes = b"", replay_layout: str = "v016") -> Iterator[FakePublisher]:
    fp = FakePublisher(topic, replay_layout=replay_layout)
    try:
        yield fp
    finally:
        fp.close()


wait_for = eventually


await_for = eventually_async


def engine_step(engine: Any, rng: random.Random, prefixes: list[list[int]]) -> None:
    """A few operations on an app Engine (admit / append / finish / evict /
    reset), refusals ignored -- what a tick of real traffic looks like."""
    from app.pool.schemas import AdmitOp, AppendOp, EvictOp, FinishOp, ResetOp
    from app.shared.errors import OperationError

    running = list(engine.manager.requests)
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        try:
            if r < 0.4 or not running:
                toks = rng.choice(prefixes) + [rng.randrange(40) for _ in range(rng.randint(0, 9))]
                lora = rng.choice([None, None, "adapter-a"])
                res = engine.apply(AdmitOp(token_ids=toks, lora_name=lora))
                running.append(res["request_id"])
            elif r < 0.6:
                toks = [rng.randrange(40) for _ in range(3)]
                engine.apply(AppendOp(request_id=rng.choice(running), token_ids=toks))
            elif r < 0.9:
                rid = running.pop(rng.randrange(len(running)))
                engine.apply(FinishOp(request_id=rid))
            elif r < 0.97:
                engine.apply(EvictOp(block_ids=[rng.randrange(1, engine.pool.num_gpu_blocks)]))
            else:
                engine.apply(ResetOp())
        except OperationError:
            pass


def engine_copies(engine: Any) -> dict[int, int]:
    """The service's real hash map as events show it: 64-bit hash -> blocks."""
    out: dict[int, int] = {}
    for key, blocks in engine.pool.cached_block_hash_to_block.iter_entries():
        h = int.from_bytes(key[-12:-4], "big")
        out[h] = out.get(h, 0) + len(blocks)
    return out
