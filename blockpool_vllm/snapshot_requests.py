"""The sender's control socket: snapshot requests, judged one message at a
time, coalesced, and answered by one capture (blockpool_vllm/sender.py says
the rules: each message inside its own error boundary, anything not a valid
``SnapshotRequest`` -- signed, fresh and with a nonce never seen, when keyed
-- dropped unanswered and counted in ``bad_requests``; one request waiting
per peer, at most ``max_waiting`` peers, none older than ``request_ttl_s``;
one capture at most per ``snapshot_every_s``; a reply never waited on).
``Sender`` is one: its thread calls ``_serve_control`` and ``_snapshots``
each loop turn.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import zmq

from blockpool.mirror import protocol as wire
from blockpool.mirror.auth import StreamKey

REQUEST_MAX_SKEW_S = 60.0  # a signed request's ts this far from now is refused
_FRAMES = 3  # identity, payload, mac
_CONTROL_PER_LOOP = 256  # control messages read per loop turn
_NONCES_KEPT = 4096  # signed requests' nonces remembered (a replay is refused)


class SnapshotRequests:
    def __init__(
        self,
        capture: Callable[[], wire.Snapshot | None],
        key: StreamKey | None,
        *,
        snapshot_every_s: float,
        request_ttl_s: float,
        max_waiting: int,
    ) -> None:
        self._capture = capture  # a slice of the copy, and the snapshot once it is whole
        self._key = key
        self.snapshot_every_s = snapshot_every_s
        self.request_ttl_s = request_ttl_s
        self.max_waiting = max_waiting
        self.snapshots = 0  # snapshot replies queued to a peer
        self.captures = 0  # captures started (each answers every waiting request)
        self.bad_requests = 0  # control messages refused, never answered
        self.requests = 0  # valid snapshot requests taken
        self.requests_dropped = 0  # valid requests dropped: superseded, stale, too many
        self.replies_dropped = 0  # replies a peer's queue could not take, or to peers gone
        # requests waiting for the next snapshot: identity -> (arrived, nonce)
        self._waiting: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()
        self._nonces: OrderedDict[bytes, None] = OrderedDict()
        self._capturing = False
        self._capture_started = -float("inf")

    @property
    def waiting(self) -> int:
        """Valid requests waiting for the next snapshot."""
        return len(self._waiting)

    def _serve_control(self, ctl: Any) -> None:
        for _ in range(_CONTROL_PER_LOOP):
            try:
                frames = self._recv_message(ctl)
            except zmq.Again:
                return
            try:
                self._request(frames)
            except Exception:  # the message's own error boundary
                self.bad_requests += 1

    def _recv_message(self, ctl: Any) -> list[bytes]:
        """One whole message, at most _FRAMES + 1 of its frames kept."""
        frames = [ctl.recv(zmq.NOBLOCK)]
        while ctl.getsockopt(zmq.RCVMORE):
            frame = ctl.recv(zmq.NOBLOCK)  # the rest of a message is there already
            if len(frames) <= _FRAMES:
                frames.append(frame)
        return frames

    def _request(self, frames: list[bytes]) -> None:
        key = self._key
        if len(frames) != _FRAMES:
            self.bad_requests += 1
            return
        identity, payload, mac = frames
        if len(payload) > wire.MAX_CONTROL_BYTES:
            self.bad_requests += 1
            return
        if key is not None and not key.verify(mac, b"snapshot?", payload):
            self.bad_requests += 1  # checked before a byte of it is decoded
            return
        try:
            msg = wire.decode(payload, limit=wire.MAX_CONTROL_BYTES)
        except wire.ProtocolError:
            msg = None
        if not isinstance(msg, wire.SnapshotRequest):
            self.bad_requests += 1
            return
        if key is not None:
            if not msg.nonce or not abs(msg.ts - time.time()) <= REQUEST_MAX_SKEW_S:
                self.bad_requests += 1
                return
            if msg.nonce in self._nonces:  # a replay
                self.bad_requests += 1
                return
            self._nonces[msg.nonce] = None
            if len(self._nonces) > _NONCES_KEPT:
                self._nonces.popitem(last=False)
        self.requests += 1
        if self._waiting.pop(identity, None) is not None:
            self.requests_dropped += 1  # superseded by the peer's newer request
        self._waiting[identity] = (time.monotonic(), msg.nonce)
        while len(self._waiting) > self.max_waiting:
            self._waiting.popitem(last=False)
            self.requests_dropped += 1

    def _snapshots(self, ctl: Any) -> None:
        now = time.monotonic()
        waiting = self._waiting
        while waiting:
            arrived, _ = next(iter(waiting.values()))
            if now - arrived <= self.request_ttl_s:
                break
            waiting.popitem(last=False)  # oldest first: arrival order
            self.requests_dropped += 1
        if not self._capturing:
            if not waiting or now - self._capture_started < self.snapshot_every_s:
                return
            self._capturing, self._capture_started = True, now
            self.captures += 1
        snap = self._capture()  # a slice copied here while the engine is idle
        if snap is None:
            return
        self._capturing = False  # a capture once started is polled to its end
        if not waiting:
            return
        payload = wire.encode(snap)  # once, for every request waiting
        for identity, (_, nonce) in list(waiting.items()):
            mac = self._key.sign(b"snapshot", nonce, payload) if self._key is not None else b""
            self.snapshots += 1  # first: a peer that has its reply sees it counted
            try:
                ctl.send_multipart([identity, payload, mac], zmq.NOBLOCK)
            except zmq.ZMQError:  # EAGAIN: its queue is full; EHOSTUNREACH: gone
                self.snapshots -= 1
                self.replies_dropped += 1
            # waiting no more once counted: a reader of ``waiting`` and the counts
            # (another thread: the beat, a test) never sees a request in neither
            del waiting[identity]
