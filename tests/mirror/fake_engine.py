"""A test-only engine side speaking the mirror's wire contract (protocol 2).

``FakeEngine`` is what the plugin's sender thread does, in a thread of its
own: a PUB socket publishing ``[TOPIC, payload, mac]`` (the handshake every
``hello_every`` seconds, the follower's batches as they are offered, a beat
when idle), and a ROUTER answering signed snapshot requests
(``[payload, mac]`` from the mirror's DEALER) with ``[payload, mac]`` signed
over the request's nonce.  A request whose mac does not verify gets no
reply.  ``key`` None: everything unsigned (an empty mac).

``forger=True`` makes it the stranger who bound the port first: it answers
every request, whatever it carries, and signs nothing it sends.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

import msgspec
import zmq

from blockpool.mirror import protocol as wire
from blockpool.mirror.auth import StreamKey
from tests.mirror.workload import FollowedEngine


class FakeEngine:
    def __init__(
        self,
        engine: FollowedEngine,
        endpoint: str,
        control_endpoint: str,
        key: StreamKey | None = None,
        *,
        forger: bool = False,
        hello_every: float = 0.5,
        beat_every: float = 0.25,
    ) -> None:
        self.engine = engine
        self.endpoint = endpoint
        self.control_endpoint = control_endpoint
        self.key = key
        self.forger = forger
        self.hello_every = hello_every
        self.beat_every = beat_every
        self.boot = os.urandom(8).hex()
        engine.follower.boot = self.boot
        self.control_port = int(control_endpoint.rpartition(":")[2])
        self.sent = 0
        self.snapshots = 0
        self.refused = 0  # requests not answered (unsigned, wrong mac, not a request)
        self._queue: queue.Queue[wire.Batch | None] = queue.Queue()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)

    # the follower's sender: the engine's thread only offers
    def offer(self, batch: wire.Batch) -> bool:
        self._queue.put(batch)
        return True

    def hello(self) -> wire.Hello:
        h = self.engine.hello(self.control_port)
        return msgspec.structs.replace(h, boot=self.boot, authenticated=self.key is not None)

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        self._ready.wait(timeout)
        if self._error is not None:
            raise self._error

    def close(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)

    # ------------------------------------------------------------- thread

    def _mac(self, *parts: bytes) -> bytes:
        return self.key.sign(*parts) if self.key is not None else b""

    def _publish(self, pub: Any, msg: wire.Message) -> None:
        payload = wire.encode(msg)
        pub.send_multipart([wire.TOPIC, payload, self._mac(wire.TOPIC, payload)])

    def _beat(self) -> wire.Beat:
        f = self.engine.follower
        return wire.Beat(
            seq=f.seq, ts=time.time(), ops=f.first_op, drops=f.drops,
            stats=self.engine.stats(), boot=self.boot,
        )  # fmt: skip

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        try:
            pub.bind(self.endpoint)
            router.bind(self.control_endpoint)
        except BaseException as exc:  # a busy port: said by start()
            pub.close(0)
            router.close(0)
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        last_hello = last_sent = 0.0
        try:
            while True:
                now = time.monotonic()
                if now - last_hello >= self.hello_every:
                    self._publish(pub, self.hello())
                    last_hello = now
                try:
                    item: wire.Batch | bool | None = self._queue.get(timeout=0.01)
                except queue.Empty:
                    item = False
                if item is None:
                    return
                if isinstance(item, wire.Batch):
                    self._publish(pub, item)
                    self.sent += 1
                    last_sent = now
                    continue
                if now - last_sent >= self.beat_every and self._queue.empty():
                    self._publish(pub, self._beat())
                    last_sent = now
                self._serve(router)
        finally:
            pub.close(0)
            router.close(0)

    def _serve(self, router: Any) -> None:
        while router.poll(0):
            frames = router.recv_multipart()
            if len(frames) != 3:
                self.refused += 1
                continue
            ident, payload, mac = frames
            if not self.forger:
                if self.key is not None and not self.key.verify(mac, b"snapshot?", payload):
                    self.refused += 1
                    continue
                try:
                    req = wire.decode(payload, wire.MAX_CONTROL_BYTES)
                except wire.ProtocolError:
                    req = None
                if not isinstance(req, wire.SnapshotRequest):
                    self.refused += 1
                    continue
                nonce = req.nonce
            else:
                nonce = b""
            snap = self._snapshot()
            if snap is None:
                continue
            data = wire.encode(snap)
            router.send_multipart([ident, data, self._mac(b"snapshot", nonce, data)])
            self.snapshots += 1

    def _snapshot(self) -> wire.Snapshot | None:
        """As the plugin's sender: copied over the engine's steps, or here when idle."""
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            snap = self.engine.follower.poll_snapshot()
            if snap is not None:
                return msgspec.structs.replace(snap, boot=self.boot)
            time.sleep(0.002)
        return None


def forged_stream(endpoint: str, control_endpoint: str, key: StreamKey | None) -> FakeEngine:
    """A stranger's engine on the mirror's endpoint: a pool of its own, driven."""
    fake = FakeEngine(FollowedEngine(), endpoint, control_endpoint, key, forger=key is None)
    fake.engine.send = fake.offer
    return fake
