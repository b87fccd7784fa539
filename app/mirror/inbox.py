"""The mirror's inbox: the engine's PUB frames received and not yet handled.

The reader (``read``, an asyncio task of the client's) takes the plugin's
frames off ZMQ as they come, on the event loop (cheap: never decoded there),
into a bounded queue; past its bound in messages or bytes the whole backlog
is dropped (counted) and the client told, to resync from a snapshot.  The
processor takes every message waiting as one group (``take``) and opens it
(``open_all``): each message's mac verified with the shared secret, where
there is one, before a byte of it is decoded; a large group in the decoding
thread, so the service answers while a 5 MB message is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import zmq
import zmq.asyncio

from app.mirror.status import MirrorStatus
from blockpool.mirror import protocol as wire
from blockpool.mirror.auth import StreamKey

logger = logging.getLogger("blockpool.mirror")

INLINE_BYTES = 64 * 1024  # a group this small is verified and decoded on the loop
GROUP_MAX = 1024  # messages per group (one writer call)
MAX_BACKLOG = 10_000  # messages received and not applied; past it: dropped, a snapshot
MAX_BACKLOG_BYTES = 256 * 1024 * 1024

# what verifying and decoding one message came to, and whether it was signed:
# the message; None: refused (its mac did not verify); a str: why it is unreadable
Opened = tuple[wire.Message | str | None, bool]


class MirrorInbox:
    """Frames received, not yet handled: (frames, when received: monotonic,
    bytes), oldest first, and the group the processor holds."""

    def __init__(
        self,
        status: MirrorStatus,
        key: StreamKey | None,
        max_backlog: int,
        overflowed: Callable[[], None],
    ) -> None:
        self.status = status
        self.key = key
        self.max_backlog = max_backlog
        self.overflowed = overflowed  # the backlog was dropped: the client resyncs
        self.frames: deque[tuple[list[bytes], float, int]] = deque()
        self.bytes = 0
        self.arrived = asyncio.Event()
        self.in_hand: tuple[int, float] | None = None  # the group being handled

    def backlog(self) -> tuple[int, float | None]:
        """Messages received and not applied yet, and when the oldest came."""
        n, oldest = len(self.frames), self.frames[0][1] if self.frames else None
        if self.in_hand is not None:
            n += self.in_hand[0]
            oldest = self.in_hand[1]
        return n, oldest

    async def read(self, sub: zmq.asyncio.Socket) -> None:
        """Frames off ZMQ into the inbox, as they come (never decoded here)."""
        st = self.status
        try:
            while True:
                frames = await sub.recv_multipart()
                while True:
                    now = time.monotonic()
                    if len(frames) != 3 or frames[0] != wire.TOPIC:
                        st.bad_messages += 1
                    else:
                        size = len(frames[1]) + len(frames[2])
                        self.frames.append((frames, now, size))
                        self.bytes += size
                        if len(self.frames) > self.max_backlog or self.bytes > MAX_BACKLOG_BYTES:
                            self._drop()
                    if not cast(int, sub.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                        break
                    frames = await sub.recv_multipart()  # waiting already: no wait
                self.arrived.set()
        finally:
            sub.close(0)

    def _drop(self) -> None:
        """More waiting than the mirror can hold: dropped for a fresh snapshot."""
        st = self.status
        n = len(self.frames)
        st.backlog_dropped += n
        self.frames.clear()
        self.bytes = 0
        st.problem(f"{n} messages waiting, more than the mirror holds: dropped for a snapshot")
        logger.warning("mirror: a backlog of %d messages dropped; resyncing", n)
        self.overflowed()

    async def wait(self, timeout_s: float) -> None:
        """Until a frame arrives, or ``timeout_s`` passed."""
        self.arrived.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.arrived.wait()

    def take(self) -> tuple[list[list[bytes]], int]:
        """The next group (its frames and bytes), held until :meth:`done`."""
        group = [self.frames.popleft() for _ in range(min(GROUP_MAX, len(self.frames)))]
        size = sum(g[2] for g in group)
        self.bytes -= size
        self.in_hand = (len(group), group[0][1])
        return [g[0] for g in group], size

    def done(self) -> None:
        self.in_hand = None

    async def open_all(
        self, frames: list[list[bytes]], size: int, decoder: ThreadPoolExecutor | None
    ) -> list[Opened]:
        """Verified and decoded, in order; a large group in the decoding thread."""
        if size <= INLINE_BYTES or decoder is None:
            return [self.open(f) for f in frames]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(decoder, lambda: [self.open(f) for f in frames])

    def open(self, frames: list[bytes]) -> Opened:
        """(the message, signed) | (None: refused, _) | (why it is unreadable, _)."""
        _, payload, mac = frames
        if self.key is not None and not self.key.verify(mac, wire.TOPIC, payload):
            return None, False  # before a byte of it is decoded
        try:
            return wire.decode(payload, wire.MAX_BATCH_BYTES), bool(mac)
        except wire.ProtocolError as exc:
            return str(exc), bool(mac)
