"""The sender: a thread of its own that puts the follower's batches on ZMQ.

The engine's thread only ever calls ``offer`` (a non-blocking put on a
bounded queue: a full queue drops the batch, counted).  The thread encodes
and publishes on a PUB socket, re-sends the handshake every few seconds (a
mirror started later learns the engine), sends a beat when idle, and answers
snapshot requests on a REP socket (the snapshot is read by the follower's
``capture``, between two pool calls).

Binds loopback by default; an endpoint is ``tcp://HOST:PORT`` (the control
socket takes ``control_endpoint``, by default the next port).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from blockpool.mirror import protocol as wire

logger = logging.getLogger("blockpool_vllm")

HELLO_EVERY_S = 2.0
BEAT_EVERY_S = 0.5


def next_port(endpoint: str) -> str:
    """``tcp://host:P`` -> ``tcp://host:P+1`` (the control socket's default)."""
    head, _, port = endpoint.rpartition(":")
    if not head.startswith("tcp://") or not port.isdigit():
        raise ValueError(f"a mirror endpoint is tcp://HOST:PORT, got {endpoint!r}")
    return f"{head}:{int(port) + 1}"


class Sender:
    def __init__(
        self,
        endpoint: str,
        hello: Callable[[], wire.Hello],
        capture: Callable[[], wire.Snapshot | None],
        stats: Callable[[], tuple[int, int, int]],
        cost: Callable[[], tuple[int, int]] = lambda: (0, 0),
        *,
        control_endpoint: str | None = None,
        max_queue: int = 4096,
        hwm: int = 100_000,
    ) -> None:
        self.endpoint = endpoint
        self.control_endpoint = control_endpoint or next_port(endpoint)
        self._hello = hello
        self._capture = capture
        self._stats = stats
        self._cost = cost  # (steps, ns): the follower's own cost on the engine's thread
        # the last batch sent or dropped, and the operations up to its end: a
        # beat claims no more than this (what is still queued comes after it)
        self.handled_seq = 0
        self.handled_ops = 0
        self._queue: queue.Queue[wire.Batch | None] = queue.Queue(maxsize=max_queue)
        self._hwm = hwm
        self.sent = 0
        self.dropped = 0
        self.snapshots = 0
        self.bad_requests = 0
        self.control_port: int | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="blockpool-mirror", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        self._ready.wait(timeout)
        if self._error is not None:
            raise self._error

    def offer(self, batch: wire.Batch) -> bool:
        """Queue a batch for sending; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1
            self._handled(batch)
            return False
        return True

    def _handled(self, batch: wire.Batch) -> None:
        if batch.seq > self.handled_seq:
            self.handled_seq = batch.seq
            self.handled_ops = batch.first_op + len(batch.ops)

    def _send(self, pub: Any, batch: wire.Batch) -> None:
        pub.send_multipart([wire.TOPIC, wire.encode(batch), b""])
        self.sent += 1
        self._handled(batch)

    def beat(self) -> wire.Beat:
        steps, cost_ns = self._cost()
        return wire.Beat(
            seq=self.handled_seq,
            ts=time.time(),
            ops=self.handled_ops,
            drops=self.dropped,
            stats=self._stats(),
            steps=steps,
            cost_ns=cost_ns,
        )

    def close(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    # -------------------------------------------------------------- thread

    def _run(self) -> None:
        ctx: Any = zmq.Context.instance()
        try:
            pub = ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.SNDHWM, self._hwm)
            pub.setsockopt(zmq.LINGER, 0)
            pub.bind(self.endpoint)
            rep = ctx.socket(zmq.REP)
            rep.setsockopt(zmq.LINGER, 0)
            rep.setsockopt(zmq.MAXMSGSIZE, 4096)  # a request is a few bytes
            rep.bind(self.control_endpoint)
            last = rep.getsockopt(zmq.LAST_ENDPOINT)
            self.control_port = int(last.decode().rpartition(":")[2])
        except BaseException as exc:  # a busy port: said at start
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        last_hello = 0.0
        last_sent = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if now - last_hello >= HELLO_EVERY_S:
                    pub.send_multipart([wire.TOPIC, wire.encode(self._hello()), b""])
                    last_hello = now
                try:
                    item = self._queue.get(timeout=0.02)
                except queue.Empty:
                    item = ...  # type: ignore[assignment]
                if item is None:
                    return
                if isinstance(item, wire.Batch):
                    self._send(pub, item)
                    last_sent = now
                    while True:  # drain what queued meanwhile
                        try:
                            more = self._queue.get_nowait()
                        except queue.Empty:
                            break
                        if more is None:
                            return
                        self._send(pub, more)
                elif now - last_sent >= BEAT_EVERY_S:
                    pub.send_multipart([wire.TOPIC, wire.encode(self.beat()), b""])
                    last_sent = now
                self._serve_control(rep)
        finally:
            pub.close(0)
            rep.close(0)

    def _serve_control(self, rep: Any) -> None:
        while rep.poll(0):
            try:
                data = rep.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            try:
                msg = wire.decode(data)
            except wire.ProtocolError:
                msg = None
            if not isinstance(msg, wire.SnapshotRequest):
                self.bad_requests += 1
                rep.send(b"")  # a REP must answer; an empty reply says "not understood"
                continue
            snap = None
            deadline = time.monotonic() + 30.0
            while snap is None and time.monotonic() < deadline:
                snap = self._capture()  # copied over the engine's steps, or here when idle
                if snap is None:
                    time.sleep(0.002)
            if snap is None:
                rep.send(b"")
                continue
            self.snapshots += 1
            rep.send(wire.encode(snap))
