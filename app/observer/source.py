"""One observed KV-event stream (``Source``): an instance, or one data-parallel
rank of it, with its sockets, its seq tracker and its rebuilt state.

Each source runs one asyncio task over ``zmq.asyncio`` sockets (a SUB for the
live stream, a DEALER for replays, the SUB's monitor for connection state),
all in the event loop that serves the REST and websocket views -- so the
rebuilt state is only ever touched from one thread and needs no lock.

No message can end that task: each is handled under its own guard (poison is
counted by kind, ``poison.py``), and the task is supervised -- should its
socket loop fail anyway it is restarted with a doubling backoff (counted in
``task_restarts``; ``task`` says ``restarting`` meanwhile and health is then
not ``ok``).
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

from app.observer.source_health import source_health
from blockpool.kvevents.config import END_SEQ, SourceSpec
from blockpool.kvevents.decode import MAX_BATCH_BYTES, ClearedEvent, DecodeError, decode_batch
from blockpool.kvevents.event_json import EventItem
from blockpool.kvevents.poison import PoisonCounter
from blockpool.kvevents.state import InstanceState
from blockpool.kvevents.tracker import SeqTracker
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
        max_batch_bytes: int = MAX_BATCH_BYTES,
        restart_backoff: tuple[float, float] = (0.1, 10.0),
        silence_s: float = 10.0,
        max_hashes: int | None = None,
        max_batch_hashes: int | None = None,
        max_batch_events: int | None = None,
        max_batch_tokens: int | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.topic = topic.encode()
        self.replay_timeout = replay_timeout
        self.replay_backoff = replay_backoff
        self.bootstrap_replay = bootstrap_replay
        self.rcvhwm = rcvhwm
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_hashes = max_batch_hashes
        self.max_batch_events = max_batch_events
        self.max_batch_tokens = max_batch_tokens
        self.restart_backoff = restart_backoff
        self.silence_s = silence_s
        self.poison = PoisonCounter(spec.name, logger)
        self.task_state = "not started"  # running / restarting / stopped / dead
        self.task_restarts = 0
        self.last_task_error: str | None = None
        self.started_at: float | None = None
        self._wake = asyncio.Event()
        self.state = InstanceState(max_hashes)
        self.log: SeqLog[EventItem] = SeqLog(event_log_capacity)
        self.tracker = SeqTracker(
            self._apply,
            self._reset,
            has_replay=spec.replay_endpoint is not None,
            max_pending=max_pending,
        )
        self.connected = False
        self._peers: set[int] = set()  # the fds of the connections the monitor reported
        self.connects = 0
        self.disconnects = 0
        self.ranks_seen: set[int] = set()
        self.encodings: dict[str, int] = {}
        self.unknown_events = 0
        self.malformed_events = 0
        self.unknown_fields: dict[str, int] = {}  # field name -> times (kept in extra)
        self.unknown_fields_total = 0
        self.bad_messages = 0
        self.last_batch_ts: float | None = None  # the publisher's clock
        self.last_batch_at: float | None = None  # ours
        self.last_message_at: float | None = None  # ours: any live message
        self.events_total = 0
        self.resets = 0
        self.on_batch: Callable[[Source], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._replay_outstanding: int | None = None  # tracker.replay_gen of our request
        self._replay_deadline = 0.0
        self._replay_paused_until = 0.0

    # ------------------------------------------------------------- applying

    def _apply(self, seq: int, payload: bytes) -> bool:
        try:
            batch = decode_batch(
                payload,
                self.max_batch_bytes,
                self.max_batch_events,
                self.max_batch_hashes,
                self.max_batch_tokens,
            )
        except DecodeError as exc:
            self.poison.add(exc.kind, f"batch {seq}: {exc}")
            raise
        now = time.time()
        if batch.issues:
            for kind, n in batch.issues.items():
                self.poison.add(kind, f"batch {seq}", n)
            if "non_finite_ts" in batch.issues:
                batch.ts = now  # the publisher's clock is unusable: ours
        if batch.unknown_fields:
            self._count_unknown_fields(batch.unknown_fields)
        if batch.malformed:
            self.tracker.lossy(f"{batch.malformed} event(s) of batch {seq} could not be read")
        overflow = self.state.overflow
        self.state.apply(batch.events, seq, batch.ts)
        if self.state.overflow != overflow:
            self.tracker.lossy(
                f"{self.state.overflow} stored block(s) not kept: over the cap of "
                f"{self.state.max_keys} held hashes (--max-hashes)"
            )
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

    def _count_unknown_fields(self, names: dict[str, int]) -> None:
        kept = self.unknown_fields
        for name, n in names.items():
            self.unknown_fields_total += n
            if name not in kept and len(kept) >= 64:
                name = "<other>"
            kept[name] = kept.get(name, 0) + n

    def _reset(self) -> None:
        self.resets += 1
        self.state.reset()

    def feed_live(self, seq: int, payload: bytes) -> int | None:
        """A live message (what the socket loop calls; tests call it too)."""
        return self.tracker.on_live(seq, payload)

    # --------------------------------------------------------------- socket

    def start(self, ctx: zmq.asyncio.Context) -> None:
        self.started_at = time.time()
        self._task = asyncio.create_task(self._supervise(ctx), name=f"observe {self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.task_state = "stopped"

    @property
    def task_alive(self) -> bool:
        """The task runs its socket loop (not restarting, not dead)."""
        task = self._task
        if task is not None and task.done():
            self.task_state = "dead"  # pragma: no cover - the supervisor never returns
        return self.task_state == "running"

    async def _supervise(self, ctx: zmq.asyncio.Context) -> None:
        """Run the socket loop; when it fails, restart it after a backoff
        that doubles (reset after a minute without failure)."""
        first, most = self.restart_backoff
        delay = first
        while True:
            self.task_state = "running"
            began = time.monotonic()
            try:
                await self._run(ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_task_error = repr(exc)[:300]
                logger.exception("%s: the source's socket loop failed; restarting", self.name)
            else:  # pragma: no cover - _run only returns when cancelled
                self.last_task_error = "the socket loop returned"
            self.task_restarts += 1
            self.task_state = "restarting"
            if self.tracker.replaying:
                self.tracker.on_replay_failed("the source's task restarted")
            self._replay_outstanding = None
            if time.monotonic() - began > 60.0:
                delay = first
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            delay = min(delay * 2, most)

    def wake(self) -> None:
        """Restart a failed task now rather than at the end of its backoff."""
        self._wake.set()

    def _guarded(
        self, handle: Callable[[list[bytes]], int | None], frames: list[bytes]
    ) -> int | None:
        """One message, whatever it holds: an exception costs that message
        (counted, logged once per kind), never the task."""
        try:
            return handle(frames)
        except Exception as exc:
            self.poison.add("internal_error", repr(exc))
            self.tracker.exact = False
            self.tracker.reason = f"a message could not be handled: {exc!r}"[:300]
            return None

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
            zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
        )
        # a peer that hangs without closing its connection is found out by
        # heartbeats (ZMTP PING) and reported as a disconnect
        sub.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        if self.spec.bind:
            sub.bind(self.spec.endpoint)  # the publisher connects to us
        else:
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
                        start = self._guarded(self._live, frames)
                        if start is not None and dealer is not None:
                            dealer = await self._request(ctx, poller, dealer, start)
                if dealer is not None and dealer in ready:
                    for _ in range(5000):
                        try:
                            frames = await dealer.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        start = self._guarded(self._replayed, frames)
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
            self._peers.clear()

    async def _monitor(self, monitor: zmq.asyncio.Socket) -> None:
        for _ in range(100):
            try:
                frames = await monitor.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            message = parse_monitor_message(frames)
            event, fd = message["event"], message["value"]
            # a connecting SUB has one peer at a time, a bound one any number
            if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                if fd not in self._peers:
                    self.connects += 1
                self._peers.add(fd)
            elif event == zmq.EVENT_DISCONNECTED and fd in self._peers:
                self._peers.discard(fd)
                self.disconnects += 1
            self.connected = bool(self._peers)

    def _bad_frames(self, frames: list[bytes]) -> bool:
        if len(frames) == 3 and len(frames[1]) == 8:
            return False
        self.bad_messages += 1
        self.poison.add("bad_frames", f"{len(frames)} frame(s), not topic / 8-byte seq / payload")
        return True

    def _live(self, frames: list[bytes]) -> int | None:
        if self._bad_frames(frames):
            return None
        seq = int.from_bytes(frames[1], "big")
        self.last_message_at = time.time()
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
        if self._bad_frames(frames):
            return None
        self._replay_deadline = time.monotonic() + self.replay_timeout
        if frames[1] == END_SEQ:
            self._replay_outstanding = None
            return tracker.on_replay_end()
        out_of_range = tracker.replay_out_of_range
        start = tracker.on_replay(int.from_bytes(frames[1], "big"), frames[2])
        if tracker.replay_out_of_range != out_of_range:
            self.poison.add("replay_out_of_range", tracker.last_failure or "")
        return start

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

    def last_batch_age(self, now: float) -> float:
        """Seconds since the last batch applied (since the start when none
        yet): what a stalled-publisher alert watches."""
        since = self.last_batch_at or self.started_at or now
        return max(0.0, now - since)

    def silent_for(self, now: float) -> float | None:
        """Seconds since the last live message (None: none yet)."""
        return None if self.last_message_at is None else max(0.0, now - self.last_message_at)

    def stale(self, now: float) -> bool:
        """Data came, then the publisher went away: no connection and no
        message for ``silence_s``.  The map is the last one heard and may no
        longer be the engine's.  (Connected but silent is an idle engine.)"""
        silent = self.silent_for(now)
        return silent is not None and silent >= self.silence_s and not self.connected

    def exact(self, now: float) -> bool:
        """The map is the engine's: every batch applied (``tracker.exact``)
        and the publisher has not gone away (not ``stale``)."""
        return self.tracker.exact and not self.stale(now)

    def idle(self, now: float) -> bool:
        """Data came, the publisher is still connected, and nothing for
        ``silence_s``: an engine without traffic (the map stands)."""
        silent = self.silent_for(now)
        return silent is not None and silent >= self.silence_s and self.connected

    def health(self) -> dict[str, Any]:
        """Stream health, task and map summary (``source_health.py``)."""
        return source_health(self)
