"""The sender: a thread of its own that puts the follower's batches on ZMQ.

The engine's thread only ever calls ``offer`` (a non-blocking put on a
bounded queue: a full queue drops the batch, counted).  The thread encodes
and publishes on a PUB socket (frames ``[TOPIC, payload, mac]``; what queued
meanwhile in one message, blockpool_vllm/bundle.py), re-sends
the handshake every few seconds (a mirror started later learns the engine),
sends a beat when idle, and answers snapshot requests on a ROUTER socket
(blockpool_vllm/snapshot_requests.py).
Binds loopback by default; an endpoint is ``tcp://HOST:PORT`` (the control
socket takes ``control_endpoint``, by default the next port).

Nothing a peer sends, and nothing that fails here, reaches the engine:

* Start-up: a port in use (or any bind failure) is logged once and the bind
  retried every ``retry_s`` in the background (logged again when it
  succeeds); meanwhile queued batches are dropped and counted (a mirror
  resyncs from a snapshot).  ``start`` never raises.  Every socket made is
  closed on every failure path.
* The thread is supervised: any exception ends one run of its loop, is
  logged (rate limited) and counted in ``restarts``; the loop starts again
  (after a short backoff) on the same sockets.  ``restarts`` and
  ``bad_requests`` travel in every Hello and Beat.
* Each control message is read frame by frame (at most ``_FRAMES`` kept,
  the rest drained) and judged inside its own error boundary: anything but
  ``[identity, payload, mac]`` with a valid ``SnapshotRequest`` (signed,
  fresh and with a nonce never seen, when keyed) is dropped and counted in
  ``bad_requests``, with no reply (a reply to a stranger is an
  amplification).  At most ``_CONTROL_PER_LOOP`` messages are read per loop
  turn: batches are never starved by requests.
* Snapshots are coalesced: valid requests wait (one per peer, the newest;
  at most ``max_waiting`` peers, the oldest dropped; a request older than
  ``request_ttl_s`` dropped; all counted in ``requests_dropped``).  At most
  one capture is started per ``snapshot_every_s``; the follower copies it
  over the engine's steps (``capture``, polled every loop turn, never
  waited on), and the one snapshot, encoded once, answers every request
  waiting when it completes.
* Memory per peer: a reply is sent non-blocking with ``ROUTER_MANDATORY``
  on, so a reply to a peer gone (``EHOSTUNREACH``) or whose queue is full
  (``SNDHWM`` = ``peer_hwm`` replies, ``EAGAIN``) is dropped and counted in
  ``replies_dropped``, never waited on.  Requests are at most
  ``MAX_CONTROL_BYTES`` a frame (``MAXMSGSIZE``: a larger one disconnects
  its peer) and ``PEER_RCVHWM`` queued per peer (blockpool_vllm/sockets.py).
* File descriptors: one per connected peer.  ``HANDSHAKE_IVL`` drops a
  connection that never completes ZMTP's greeting, ZMTP heartbeats and TCP
  keepalive drop dead peers; live idle peers are bounded by who can reach
  the port (loopback by default) and the process's open-file limit (libzmq
  refuses a connection past it, the engine's own files are unaffected by
  the sockets already open).  The context allows ``_MAX_SOCKETS`` sockets.

With a ``StreamKey`` every frame is signed (protocol.py, auth.py):
``mac = key.sign(TOPIC, payload)`` on the stream, ``key.sign(b"snapshot",
nonce, payload)`` on a reply, and a request must carry
``key.sign(b"snapshot?", payload)``.  Without a key macs are empty.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from blockpool.common.backoff import Backoff
from blockpool.mirror import protocol as wire
from blockpool.mirror.auth import StreamKey
from blockpool_vllm.bundle import Bundle
from blockpool_vllm.call_records import count_ops
from blockpool_vllm.pacing import Pacer, tighten_timer_slack
from blockpool_vllm.snapshot_requests import SnapshotRequests
from blockpool_vllm.sockets import StreamBinding

logger = logging.getLogger("blockpool_vllm")

HELLO_EVERY_S = 2.0
BEAT_EVERY_S = 0.5
_BATCHES_PER_LOOP = 1024  # batches sent per loop turn before the control socket's turn
_MAX_SOCKETS = 16
_RESTART_BACKOFF_S = (0.05, 5.0)
_LOG_RESTART_EVERY_S = 60.0
# with turns, the longest wait for one (a shorter one would wake the thread in
# the engine's busy time and take the interpreter from it)
_TURN_WAIT_S = 0.1
_TURN_WAIT_QUEUED_S = 0.03
_OVERDUE_S = 0.25  # the engine never in a forward pass this long: the thread works anyway
# batches queued from which the thread no longer pauses between two: an
# engine with no time of its own still has its stream, at the price of waits
_PACED_BACKLOG = 8
_BUNDLE = 64  # batches in one message, at most (wire.MAX_BATCHES_PER_MESSAGE)
_OVERDUE_BATCHES = 64  # ... or this many batches queued


def next_port(endpoint: str) -> str:
    """``tcp://host:P`` -> ``tcp://host:P+1`` (the control socket's default)."""
    head, _, port = endpoint.rpartition(":")
    if not head.startswith("tcp://") or not port.isdigit():
        raise ValueError(f"a mirror endpoint is tcp://HOST:PORT, got {endpoint!r}")
    return f"{head}:{int(port) + 1}"


class _Stop(Exception):
    """close() was called."""


class Sender(SnapshotRequests):
    def __init__(
        self,
        endpoint: str,
        hello: Callable[[], wire.Hello],
        capture: Callable[[], wire.Snapshot | None],
        stats: Callable[[], tuple[int, int, int]],
        cost: Callable[[], tuple[int, int]] = lambda: (0, 0),
        *,
        cost_us: Callable[[], tuple[float, float, float] | None] = lambda: None,
        digest: Callable[[], wire.Digest | None] = lambda: None,
        reading: Callable[[], wire.DigestReading | None] = lambda: None,
        background: Callable[[], object] = lambda: None,
        prepare: Callable[[wire.Batch], wire.Batch] = lambda b: b,
        turn: Callable[[float, bool], bool] | None = None,
        pace: Pacer | None = None,
        control_endpoint: str | None = None,
        key: StreamKey | None = None,
        max_queue: int = 4096,
        hwm: int = 100_000,
        retry_s: float = 5.0,
        snapshot_every_s: float = 1.0,
        request_ttl_s: float = 30.0,
        max_waiting: int = 64,
        peer_hwm: int = 2,
    ) -> None:
        SnapshotRequests.__init__(
            self,
            capture,
            key,
            snapshot_every_s=snapshot_every_s,
            request_ttl_s=request_ttl_s,
            max_waiting=max_waiting,
        )
        self.endpoint = endpoint
        self.control_endpoint = control_endpoint or next_port(endpoint)
        self._hello = hello
        self._stats = stats
        self._cost = cost  # (steps, ns): the follower's own cost on the engine's thread
        self._cost_us = cost_us  # its p50, p99, max per step (µs)
        self._digest = digest  # the engine's newest digest, for a beat
        self._reading = reading  # how far behind the engine's digest is, for a beat
        self._background = background  # the follower's work off the engine's thread
        self._prepare = prepare  # a batch's operations read from the blocks (the follower)
        # waits for the engine's forward pass (or idleness): the thread works
        # then only, unless batches pile up (None: whenever there is work)
        self._turn = turn
        # between two batches: a moment's sleep when due (blockpool_vllm/pacing.py)
        self._pace = pace
        self._last_turn = time.monotonic()
        # the sockets, bound (retried while they cannot be)
        self.binding = StreamBinding(
            endpoint, self.control_endpoint, hwm=hwm, peer_hwm=peer_hwm, retry_s=retry_s
        )
        # the last batch sent or dropped, and the operations up to its end: a
        # beat claims no more than this (what is still queued comes after it)
        self.handled_seq = 0
        self.handled_ops = 0
        self._batch_drops = 0  # the follower's drops, as its last batch handled said
        # (a SimpleQueue, bounded here: the engine's put is one call in C, no
        # lock and condition taken in Python -- ~0.5 µs less a flush, two a step)
        self._queue: queue.SimpleQueue[wire.Batch | None] = queue.SimpleQueue()
        self._max_queue = max_queue
        self.sent = 0  # batches published
        self.bundles = 0  # messages that held several (wire.Batches)
        self.dropped = 0  # batches dropped (a full queue, or not bound yet)
        self.restarts = 0  # the loop's restarts after an exception
        self.timer_slack_tight = False  # the thread asked Linux for short sleeps (pacing.py)
        self._last_hello = -float("inf")
        self._last_sent = time.monotonic()
        self._last_restart_log = -float("inf")
        self._ready = threading.Event()  # the first bind attempt was made
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="blockpool-mirror", daemon=True)

    # ------------------------------------------------------ engine's side

    def start(self, timeout: float = 30.0) -> bool:
        """Start the thread; True once bound (False: not yet, retried in the
        background).  Never raises."""
        try:
            self._thread.start()
            self._ready.wait(timeout)
        except Exception:
            logger.exception("blockpool mirror: the sender did not start")
        return self.binding.bound

    @property
    def control_port(self) -> int | None:
        """The snapshot socket's port, once bound."""
        return self.binding.control_port

    def offer(self, batch: wire.Batch) -> bool:
        """Queue a batch for sending; False (and counted) when the queue is full."""
        # (the engine's thread is the one that puts: the size only falls meanwhile)
        if self._queue.qsize() >= self._max_queue:
            self.dropped += 1
            self._handled(batch)
            return False
        self._queue.put(batch)
        return True

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._queue.put(None)  # (past the bound: the thread's signal to stop)
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -------------------------------------------------------- messages

    def hello(self) -> wire.Hello:
        h = self._hello()
        return msgspec.structs.replace(
            h,
            control_port=self.control_port or h.control_port,
            authenticated=self._key is not None,
            restarts=self.restarts,
            bad_requests=self.bad_requests,
            cost_us=self._cost_us(),
            reading=self._reading(),
        )

    def beat(self) -> wire.Beat:
        steps, cost_ns = self._cost()
        return wire.Beat(
            seq=self.handled_seq,
            ts=time.time(),
            ops=self.handled_ops,
            drops=max(self.dropped, self._batch_drops),  # never less than a batch said
            stats=self._stats(),
            steps=steps,
            cost_ns=cost_ns,
            cost_us=self._cost_us(),
            restarts=self.restarts,
            bad_requests=self.bad_requests,
            boot=self._hello().boot,  # the run of the plugin (a mirror drops others')
            digest=self._digest(),
            reading=self._reading(),
        )

    def _handled(self, batch: wire.Batch) -> None:
        # (not prepared: its calls kept as the follower keeps them)
        self._handled_upto(batch.seq, batch.first_op + count_ops(batch.ops), batch.drops)

    def _handled_upto(self, seq: int, end_op: int, drops: int) -> None:
        """Batches up to ``seq`` (its operations ending at ``end_op``) sent or dropped."""
        if seq > self.handled_seq:
            self.handled_seq = seq
            self.handled_ops = end_op
            self._batch_drops = max(self._batch_drops, drops)

    def _publish(self, pub: Any, msg: wire.Message) -> None:
        self._publish_payload(pub, wire.encode(msg))

    def _publish_payload(self, pub: Any, payload: bytes) -> None:
        mac = self._key.sign(wire.TOPIC, payload) if self._key is not None else b""
        pub.send_multipart([wire.TOPIC, payload, mac])

    # ---------------------------------------------------------- thread

    def _main(self) -> None:
        self.timer_slack_tight = tighten_timer_slack()  # (pacing's sleeps: as short as asked)
        ctx: Any = zmq.Context()
        try:
            with contextlib.suppress(zmq.ZMQError):
                ctx.set(zmq.MAX_SOCKETS, _MAX_SOCKETS)
            sockets = self.binding.until_bound(
                ctx, self._stop, self._ready.set, self._discard_queued
            )
            if sockets is None:
                return
            pub, ctl = sockets
            try:
                self._supervise(pub, ctl)
            finally:
                pub.close(0)
                ctl.close(0)
        except Exception:  # the supervisor itself: the stream ends, the engine runs on
            logger.exception("blockpool mirror: the sender stopped")
        finally:
            self.binding.bound = False
            self._ready.set()
            ctx.destroy(0)

    def _discard_queued(self) -> None:
        """Not bound: what the engine queued is dropped (the mirror resyncs)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self.dropped += 1
                self._handled(item)

    def _supervise(self, pub: Any, ctl: Any) -> None:
        backoff = Backoff(*_RESTART_BACKOFF_S)
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self._loop(pub, ctl)
                return
            except _Stop:
                return
            except Exception:
                self.restarts += 1
                now = time.monotonic()
                if now - self._last_restart_log >= _LOG_RESTART_EVERY_S:
                    self._last_restart_log = now
                    logger.exception(
                        "blockpool mirror: the sender failed (restart %d; the stream goes on)",
                        self.restarts,
                    )
            if time.monotonic() - began > 10.0:
                backoff.reset()  # it had run a while: a fresh failure
            self._stop.wait(backoff.failed())

    def _waited_turn(self) -> bool:
        """Whether this loop turn may work: the engine's forward pass or
        idleness came (waited for here, a little), or the thread has not
        worked for ``_OVERDUE_S`` or batches pile up (an engine whose
        thread never waits still has its stream, at the price of sharing
        the interpreter)."""
        # (batches waiting: a shorter wait, so that an engine gone idle has its
        # last step's batch out once it has been so for IDLE_AFTER_S)
        queued = not self._queue.empty()
        wait = _TURN_WAIT_QUEUED_S if queued else _TURN_WAIT_S
        if self._turn is None or self._turn(wait, queued):
            self._last_turn = time.monotonic()
            return True
        if (
            time.monotonic() - self._last_turn >= _OVERDUE_S
            or self._queue.qsize() >= _OVERDUE_BATCHES
        ):
            self._last_turn = time.monotonic()
            return True
        return False

    def _loop(self, pub: Any, ctl: Any) -> None:
        while True:
            if self._stop.is_set():
                raise _Stop
            if not self._waited_turn():
                continue
            now = time.monotonic()
            if now - self._last_hello >= HELLO_EVERY_S:
                self._last_hello = now  # first: a failing hello does not repeat at once
                self._publish(pub, self.hello())
            try:  # (with turns: what is queued now, the next turn takes the rest)
                item = (
                    self._queue.get(timeout=0.01)
                    if self._turn is None
                    else self._queue.get_nowait()
                )
            except queue.Empty:
                pass
            else:
                self._send_batches(pub, item)
                self._last_sent = time.monotonic()
            self._serve_control(ctl)
            self._snapshots(ctl)
            if time.monotonic() - self._last_sent >= BEAT_EVERY_S:
                self._last_sent = time.monotonic()
                self._publish(pub, self.beat())
            # last: the reading that the engine's return from its pass ends --
            # then straight back to waiting, no more Python in the engine's step
            # (bench.gpu_scale.ab, sync: its mean step ~0.1 ms shorter, within that bench's spread)
            self._background()

    def _send_batches(self, pub: Any, item: wire.Batch | None) -> None:
        """This batch and what queued meanwhile, at most _BATCHES_PER_LOOP (the
        rest waits for the next turn, after the control socket's), in as few
        messages as they fit: up to _BUNDLE a message (blockpool_vllm/bundle.py)."""
        bundle = Bundle()
        try:
            for left in range(_BATCHES_PER_LOOP - 1, -1, -1):
                if item is None:
                    raise _Stop
                try:
                    bundle.add(self._prepare(item))
                except BaseException:
                    self.dropped += 1  # this batch is lost (the mirror sees the gap)
                    self._handled(item)
                    raise
                if not left:
                    return
                pace = self._pace if self._queue.qsize() < _PACED_BACKLOG else None
                if len(bundle) >= _BUNDLE or (pace is not None and pace.due()):
                    out, bundle = bundle, Bundle()  # (out before the engine is let in)
                    self._publish_bundle(pub, out)
                if pace is not None:
                    pace()  # (a backlog is sent in one go: the stream keeps up)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    return
        finally:  # what was prepared goes out, whatever happened after
            if bundle:
                self._publish_bundle(pub, bundle)

    def _publish_bundle(self, pub: Any, bundle: Bundle) -> None:
        """What was not published is dropped and counted (the mirror sees the gap)."""
        try:
            bundle.publish(lambda payload: self._publish_payload(pub, payload))
        finally:
            self.sent += bundle.published
            self.dropped += len(bundle) - bundle.published
            self.bundles += bundle.one_message
            self._handled_upto(bundle.seq, bundle.end_op, bundle.drops)
