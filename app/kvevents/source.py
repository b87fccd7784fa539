"""One observed KV-event stream (``Source``): an instance, or one data-parallel
rank of it, with its sockets, its seq tracker and its rebuilt state.

Each source runs one asyncio task over ``zmq.asyncio`` sockets (a SUB for the
live stream, a DEALER for replays, the SUB's monitor for connection state),
all in the event loop that serves the REST and websocket views -- so the
rebuilt state is only ever touched from one thread and needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from app.kvevents.config import END_SEQ, SourceSpec
from app.kvevents.decode import ClearedEvent, decode_batch
from app.kvevents.event_json import EventItem
from app.kvevents.state import InstanceState
from app.kvevents.tracker import SeqTracker
from blockpool.runtime.seqlog import SeqLog

logger = logging.getLogger("blockpool.observer")


class Source:
    """One stream: its sockets, its seq tracker and its rebuilt state."""

    def __init__(
        self,
        spec: SourceSpec,
        topic: str = "",
        event_log_capacity: int = 20_000,
        replay_timeout: float = 3.0,
        replay_backoff: float = 10.0,
        bootstrap_replay: bool = True,
        max_pending: int = 100_000,
        rcvhwm: int = 100_000,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.topic = topic.encode()
        self.replay_timeout = replay_timeout
        self.replay_backoff = replay_backoff
        self.bootstrap_replay = bootstrap_replay
        self.rcvhwm = rcvhwm
        self.state = InstanceState()
        self.log: SeqLog[EventItem] = SeqLog(event_log_capacity)
        self.tracker = SeqTracker(
            self._apply,
            self._reset,
            has_replay=spec.replay_endpoint is not None,
            max_pending=max_pending,
        )
        self.connected = False
        self.connects = 0
        self.disconnects = 0
        self.ranks_seen: set[int] = set()
        self.encodings: dict[str, int] = {}
        self.unknown_events = 0
        self.malformed_events = 0
        self.bad_messages = 0
        self.last_batch_ts: float | None = None  # the publisher's clock
        self.last_batch_at: float | None = None  # ours
        self.events_total = 0
        self.resets = 0
        self.on_batch: Callable[[Source], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._replay_outstanding: int | None = None  # tracker.replay_gen of our request
        self._replay_deadline = 0.0
        self._replay_paused_until = 0.0

    # ------------------------------------------------------------- applying

    def _apply(self, seq: int, payload: bytes) -> bool:
        batch = decode_batch(payload)
        now = time.time()
        self.state.apply(batch.events, seq, batch.ts)
        self.encodings[batch.encoding] = self.encodings.get(batch.encoding, 0) + 1
        if batch.data_parallel_rank is not None:
            self.ranks_seen.add(batch.data_parallel_rank)
        self.unknown_events += batch.unknown
        self.malformed_events += batch.malformed
        self.last_batch_ts = batch.ts
        self.last_batch_at = now
        self.events_total += len(batch.events)
        if batch.events:
            self.log.extend(batch.ts, [(seq, ev) for ev in batch.events])
        if self.on_batch is not None:
            self.on_batch(self)
        return any(isinstance(ev, ClearedEvent) for ev in batch.events)

    def _reset(self) -> None:
        self.resets += 1
        self.state.reset()

    def feed_live(self, seq: int, payload: bytes) -> int | None:
        """A live message (what the socket loop calls; tests call it too)."""
        return self.tracker.on_live(seq, payload)

    # --------------------------------------------------------------- socket

    def start(self, ctx: zmq.asyncio.Context) -> None:
        self._task = asyncio.create_task(self._run(ctx), name=f"observe {self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _new_dealer(self, ctx: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVHWM, 0)  # a replay may be long: never drop it
        assert self.spec.replay_endpoint is not None
        dealer.connect(self.spec.replay_endpoint)
        return dealer

    async def _run(self, ctx: zmq.asyncio.Context) -> None:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.rcvhwm)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        monitor = sub.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
        )
        sub.connect(self.spec.endpoint)
        dealer = self._new_dealer(ctx) if self.spec.replay_endpoint else None
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        if dealer is not None:
            poller.register(dealer, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll(100))
                if monitor in ready:
                    await self._monitor(monitor)
                if sub in ready:
                    for _ in range(2000):
                        try:
                            frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        start = self._live(frames)
                        if start is not None and dealer is not None:
                            dealer = await self._request(ctx, poller, dealer, start)
                if dealer is not None and dealer in ready:
                    for _ in range(5000):
                        try:
                            frames = await dealer.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        start = self._replayed(frames)
                        if start is not None:
                            dealer = await self._request(ctx, poller, dealer, start)
                if dealer is not None:
                    dealer = await self._check_replay(ctx, poller, dealer)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            if dealer is not None:
                dealer.close(linger=0)
            self.connected = False

    async def _monitor(self, monitor: zmq.asyncio.Socket) -> None:
        for _ in range(100):
            try:
                frames = await monitor.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)["event"]
            if event in (zmq.EVENT_CONNECTED, zmq.EVENT_HANDSHAKE_SUCCEEDED):
                if not self.connected:
                    self.connects += 1
                self.connected = True
            elif event == zmq.EVENT_DISCONNECTED:
                if self.connected:
                    self.disconnects += 1
                self.connected = False

    def _live(self, frames: list[bytes]) -> int | None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.bad_messages += 1
            return None
        seq = int.from_bytes(frames[1], "big")
        tracker = self.tracker
        tracker.has_replay = (
            self.spec.replay_endpoint is not None and time.monotonic() >= self._replay_paused_until
        )
        if (
            not self.bootstrap_replay
            and tracker.applied is None
            and not tracker.replaying
            and seq != 0
        ):
            tracker.has_replay = False  # join without asking for the history
        return tracker.on_live(seq, frames[2])

    def _replayed(self, frames: list[bytes]) -> int | None:
        tracker = self.tracker
        if self._replay_outstanding != tracker.replay_gen or not tracker.replaying:
            tracker.stale_replies += 1
            return None
        if len(frames) != 3 or len(frames[1]) != 8:
            self.bad_messages += 1
            return None
        self._replay_deadline = time.monotonic() + self.replay_timeout
        if frames[1] == END_SEQ:
            self._replay_outstanding = None
            return tracker.on_replay_end()
        tracker.on_replay(int.from_bytes(frames[1], "big"), frames[2])
        return None

    async def _request(
        self,
        ctx: zmq.asyncio.Context,
        poller: zmq.asyncio.Poller,
        dealer: zmq.asyncio.Socket,
        start: int,
    ) -> zmq.asyncio.Socket:
        """Send a replay request from ``start`` (a fresh socket if an older
        request may still be answering)."""
        tracker = self.tracker
        if self._replay_outstanding is not None:
            dealer = self._swap(ctx, poller, dealer)
        self._replay_outstanding = tracker.replay_gen
        self._replay_deadline = time.monotonic() + self.replay_timeout
        try:
            await asyncio.wait_for(
                dealer.send_multipart((b"", start.to_bytes(8, "big"))), self.replay_timeout
            )
        except (TimeoutError, zmq.ZMQError) as exc:
            return await self._fail(ctx, poller, dealer, f"replay request not sent: {exc!r}")
        return dealer

    async def _check_replay(
        self, ctx: zmq.asyncio.Context, poller: zmq.asyncio.Poller, dealer: zmq.asyncio.Socket
    ) -> zmq.asyncio.Socket:
        tracker = self.tracker
        if self._replay_outstanding is None:
            return dealer
        if not tracker.replaying or self._replay_outstanding != tracker.replay_gen:
            # the tracker gave the replay up (restart, overflow): drop its replies
            self._replay_outstanding = None
            return self._swap(ctx, poller, dealer)
        if time.monotonic() > self._replay_deadline:
            return await self._fail(
                ctx, poller, dealer, f"no replay answer within {self.replay_timeout:g} s"
            )
        return dealer

    async def _fail(
        self,
        ctx: zmq.asyncio.Context,
        poller: zmq.asyncio.Poller,
        dealer: zmq.asyncio.Socket,
        reason: str,
    ) -> zmq.asyncio.Socket:
        self._replay_outstanding = None
        dealer = self._swap(ctx, poller, dealer)
        self._replay_paused_until = time.monotonic() + self.replay_backoff
        self.tracker.has_replay = False
        logger.warning("%s: %s", self.name, reason)
        start = self.tracker.on_replay_failed(reason)
        if start is not None:  # pragma: no cover - has_replay is off during the backoff
            return await self._request(ctx, poller, dealer, start)
        return dealer

    def _swap(
        self, ctx: zmq.asyncio.Context, poller: zmq.asyncio.Poller, dealer: zmq.asyncio.Socket
    ) -> zmq.asyncio.Socket:
        poller.unregister(dealer)
        dealer.close(linger=0)
        fresh = self._new_dealer(ctx)
        poller.register(fresh, zmq.POLLIN)
        return fresh

    # ---------------------------------------------------------------- views

    def health(self) -> dict[str, Any]:
        t = self.tracker
        now = time.time()
        return {
            "name": self.name,
            "endpoint": self.spec.endpoint,
            "replay_endpoint": self.spec.replay_endpoint,
            "data_parallel_rank": self.spec.data_parallel_rank,
            "ranks_seen": sorted(self.ranks_seen),
            "connected": self.connected,
            "connects": self.connects,
            "disconnects": self.disconnects,
            "exact": t.exact,
            "inexact_reason": t.reason,
            "first_seq": t.first_seq,
            "last_seq": t.applied,
            "live_seq": t.live_last,
            "received": t.received,
            "batches": t.batches,
            "events": self.events_total,
            "duplicates": t.duplicates,
            "gaps": t.gaps,
            "missed": t.missed,
            "drops": t.missed,
            "replays": t.replays,
            "replay_batches": t.replay_batches,
            "replay_failures": t.replay_failures,
            "last_replay_failure": t.last_failure,
            "replaying": t.replaying,
            "pending": len(t.pending),
            "restarts": t.restarts,
            "decode_errors": t.decode_errors,
            "bad_messages": self.bad_messages,
            "unknown_events": self.unknown_events,
            "malformed_events": self.malformed_events,
            "encodings": dict(self.encodings),
            "last_batch_ts": self.last_batch_ts,
            "last_batch_age_s": None if self.last_batch_at is None else now - self.last_batch_at,
            "event_log_seq": self.log.last_seq,
            **self.state.summary(),
        }
