"""One observed source's sockets and the loop that reads them
(``SourceSockets``): a SUB for the live stream, a DEALER for replays, the
SUB's monitor for connection state, all ``zmq.asyncio`` in the event loop
that serves the views.

No message can end the loop's task: each is handled under its own guard
(poison is counted by kind, ``poison.py``), and the task is supervised --
should the socket loop fail anyway it is restarted with a doubling backoff
(counted in the source's ``task_restarts``; ``task`` says ``restarting``
meanwhile and health is then not ``ok``).

Replay replies are read in either release's layout (``replay_frames.py``).
One publisher per instance: the live messages of the first connection to
send are applied, another connection's refused and counted, until the
first's close hands over (``_admit``).  Every frame meets the byte cap
(``ZMQ_MAXMSGSIZE``) before it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from blockpool.common.backoff import Backoff
from blockpool.kvevents.config import END_SEQ, SourceSpec
from blockpool.kvevents.poison import PoisonCounter
from blockpool.kvevents.replay_frames import replay_layout
from blockpool.kvevents.tracker import SeqTracker

logger = logging.getLogger("blockpool.observer")


class SocketOwner(Protocol):
    """What the sockets read and keep of their source (``source.Source``)."""

    name: str
    spec: SourceSpec
    topic: bytes
    rcvhwm: int
    tracker: SeqTracker
    poison: PoisonCounter
    bootstrap_replay: bool
    replay_timeout: float
    replay_backoff: float
    restart_backoff: tuple[float, float]
    task_state: str
    task_restarts: int
    last_task_error: str | None
    connected: bool
    connects: int
    disconnects: int
    bad_messages: int
    last_message_at: float | None
    replay_layouts: dict[str, int]
    max_batch_bytes: int
    refused_messages: int
    refused_publishers: int
    publisher_changes: int


def source_fd(frame: zmq.Frame) -> int | None:
    """The connection a received message came over (libzmq's ZMQ_SRCFD, the
    connection's file descriptor); None where libzmq cannot say."""
    try:
        fd = frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError, ValueError):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


class SourceSockets:
    """The socket side of one ``Source``: what it reads goes to the
    source's tracker; connection and task state are kept on the source."""

    def __init__(self, src: SocketOwner) -> None:
        self.src = src
        self._wake = asyncio.Event()
        self._peers: set[int] = set()  # the fds of the connections the monitor reported
        # the connection (its fd) whose live messages are applied: the first to
        # send, until the monitor reports it closed (``_admit``)
        self._publisher: int | None = None
        self._refused: set[int] = set()  # connections refused while it holds
        self._replay_outstanding: int | None = None  # tracker.replay_gen of our request
        self._replay_deadline = 0.0
        self._replay_paused_until = 0.0

    async def supervise(self, ctx: zmq.asyncio.Context) -> None:
        """Run the socket loop; when it fails, restart it after a backoff
        that doubles (reset after a minute without failure)."""
        backoff = Backoff(*self.src.restart_backoff)
        while True:
            self.src.task_state = "running"
            began = time.monotonic()
            try:
                await self._run(ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.src.last_task_error = repr(exc)[:300]
                logger.exception("%s: the source's socket loop failed; restarting", self.src.name)
            else:  # pragma: no cover - _run only returns when cancelled
                self.src.last_task_error = "the socket loop returned"
            self.src.task_restarts += 1
            self.src.task_state = "restarting"
            if self.src.tracker.replaying:
                self.src.tracker.on_replay_failed("the source's task restarted")
            self._replay_outstanding = None
            if time.monotonic() - began > 60.0:
                backoff.reset()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), backoff.failed())

    def _guarded(
        self, handle: Callable[[list[bytes]], int | None], frames: list[bytes]
    ) -> int | None:
        """One message, whatever it holds: an exception costs that message
        (counted, logged once per kind), never the task."""
        try:
            return handle(frames)
        except Exception as exc:
            self.src.poison.add("internal_error", repr(exc))
            self.src.tracker.exact = False
            self.src.tracker.reason = f"a message could not be handled: {exc!r}"[:300]
            return None

    def _new_dealer(self, ctx: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.src.max_batch_bytes)
        dealer.setsockopt(zmq.RCVHWM, 0)  # a replay may be long: never drop it
        assert self.src.spec.replay_endpoint is not None
        dealer.connect(self.src.spec.replay_endpoint)
        return dealer

    async def _run(self, ctx: zmq.asyncio.Context) -> None:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.src.rcvhwm)
        sub.setsockopt(zmq.SUBSCRIBE, self.src.topic)
        # a frame over the cap closes its connection before it is read (libzmq
        # checks the size each frame announces): it is never held in memory
        sub.setsockopt(zmq.MAXMSGSIZE, self.src.max_batch_bytes)
        monitor = sub.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
        )
        # a peer that hangs without closing its connection is found out by
        # heartbeats (ZMTP PING) and reported as a disconnect
        sub.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        if self.src.spec.bind:
            sub.bind(self.src.spec.endpoint)  # the publisher connects to us
        else:
            sub.connect(self.src.spec.endpoint)
        dealer = self._new_dealer(ctx) if self.src.spec.replay_endpoint else None
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
                            parts = await sub.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        if not await self._admit(source_fd(parts[0]), monitor):
                            continue
                        frames = [part.bytes for part in parts]
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
            self.src.connected = False
            self._peers.clear()
            self._publisher = None
            self._refused.clear()

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
                    self.src.connects += 1
                self._peers.add(fd)
            elif event == zmq.EVENT_DISCONNECTED:
                if fd == self._publisher:
                    self._publisher = None  # the next connection to send takes over
                self._refused.discard(fd)
                if fd in self._peers:
                    self._peers.discard(fd)
                    self.src.disconnects += 1
            self.src.connected = bool(self._peers)

    async def _admit(self, fd: int | None, monitor: zmq.asyncio.Socket) -> bool:
        """One publisher per instance: whether a live message that came over
        connection ``fd`` is the instance's.  The first connection to send is
        the publisher's until the monitor reports it closed; the next one to
        send then takes over (a restarted engine connects anew, and its seq
        going back resets the map).  Another connection's messages meanwhile
        are refused unread and counted -- a second process on a ``--bind``
        address can neither wipe the map nor add to it.  (A libzmq that no
        longer names the connection, ``fd`` None: every message is taken.)"""
        if fd is None or fd == self._publisher:
            return True
        if self._publisher is not None:
            await self._monitor(monitor)  # its close may be on its way
        if self._publisher is None:
            if self.src.tracker.received:
                self.src.publisher_changes += 1
            self._publisher = fd
            self._refused.discard(fd)
            return True
        self.src.refused_messages += 1
        if fd not in self._refused:
            self._refused.add(fd)
            self.src.refused_publishers += 1
            logger.warning(
                "%s: refused the messages of a second publisher connection: the instance "
                "has one publisher, connected first (refused connections so far: %d)",
                self.src.name, self.src.refused_publishers,
            )  # fmt: skip
        return False

    def _bad_frames(self, frames: list[bytes]) -> bool:
        if len(frames) == 3 and len(frames[1]) == 8:
            return False
        self.src.bad_messages += 1
        self.src.poison.add(
            "bad_frames", f"{len(frames)} frame(s), not topic / 8-byte seq / payload"
        )
        return True

    def _replay_reply(self, frames: list[bytes]) -> tuple[bytes, bytes] | None:
        """(seq, payload) of one replay reply, in either layout (``replay_layout``),
        told apart per reply; None (counted as ``bad_frames``) for anything else."""
        layout = replay_layout(frames, self.src.topic)
        if layout is None:
            self.src.bad_messages += 1
            self.src.poison.add(
                "bad_frames",
                f"replay reply of {len(frames)} frame(s), neither '' / seq / payload "
                "(vLLM 0.16) nor '' / topic / seq / payload (vLLM 0.24 on)",
            )
            return None
        counts = self.src.replay_layouts
        counts[layout] = counts.get(layout, 0) + 1
        return frames[-2], frames[-1]

    def _live(self, frames: list[bytes]) -> int | None:
        if self._bad_frames(frames):
            return None
        seq = int.from_bytes(frames[1], "big")
        self.src.last_message_at = time.time()
        tracker = self.src.tracker
        tracker.has_replay = (
            self.src.spec.replay_endpoint is not None
            and time.monotonic() >= self._replay_paused_until
        )
        if (
            not self.src.bootstrap_replay
            and tracker.applied is None
            and not tracker.replaying
            and seq != 0
        ):
            tracker.has_replay = False  # join without asking for the history
        return tracker.on_live(seq, frames[2])

    def _replayed(self, frames: list[bytes]) -> int | None:
        tracker = self.src.tracker
        if self._replay_outstanding != tracker.replay_gen or not tracker.replaying:
            tracker.stale_replies += 1
            return None
        reply = self._replay_reply(frames)
        if reply is None:
            return None
        seq_bytes, payload = reply
        self._replay_deadline = time.monotonic() + self.src.replay_timeout
        if seq_bytes == END_SEQ:
            self._replay_outstanding = None
            return tracker.on_replay_end()
        out_of_range = tracker.replay_out_of_range
        start = tracker.on_replay(int.from_bytes(seq_bytes, "big"), payload)
        if tracker.replay_out_of_range != out_of_range:
            self.src.poison.add("replay_out_of_range", tracker.last_failure or "")
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
        tracker = self.src.tracker
        if self._replay_outstanding is not None:
            dealer = self._swap(ctx, poller, dealer)
        self._replay_outstanding = tracker.replay_gen
        self._replay_deadline = time.monotonic() + self.src.replay_timeout
        try:
            await asyncio.wait_for(
                dealer.send_multipart((b"", start.to_bytes(8, "big"))), self.src.replay_timeout
            )
        except (TimeoutError, zmq.ZMQError) as exc:
            return await self._fail(ctx, poller, dealer, f"replay request not sent: {exc!r}")
        return dealer

    async def _check_replay(
        self, ctx: zmq.asyncio.Context, poller: zmq.asyncio.Poller, dealer: zmq.asyncio.Socket
    ) -> zmq.asyncio.Socket:
        tracker = self.src.tracker
        if self._replay_outstanding is None:
            return dealer
        if not tracker.replaying or self._replay_outstanding != tracker.replay_gen:
            # the tracker gave the replay up (restart, overflow): drop its replies
            self._replay_outstanding = None
            return self._swap(ctx, poller, dealer)
        if time.monotonic() > self._replay_deadline:
            return await self._fail(
                ctx, poller, dealer, f"no replay answer within {self.src.replay_timeout:g} s"
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
        self._replay_paused_until = time.monotonic() + self.src.replay_backoff
        self.src.tracker.has_replay = False
        logger.warning("%s: %s", self.src.name, reason)
        start = self.src.tracker.on_replay_failed(reason)
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

    def wake(self) -> None:
        """Restart a failed task now rather than at the end of its backoff."""
        self._wake.set()
