"""Fan-out to websocket clients: encode once, never await a client.

The owner (the pool stream's hub, the observer's hub) encodes a message once
and offers the same bytes or text to every subscriber's small bounded queue
with ``put_nowait``.  A subscriber whose queue is full loses what it had
queued and is marked ``needs_resync``: it gets what lets it catch up instead
of the frames it missed -- a snapshot at the pool stream's next tick, a
``resync`` notice at once from the observer.  Drops, resyncs, what was sent
and who went away are counted (``BroadcastCounts``); ``ws_endpoint.py``
serves one subscriber's socket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from blockpool.common.figures import counter

T = TypeVar("T", bytes, str)


@dataclass(eq=False, kw_only=True)
class Subscriber(Generic[T]):
    """One client: its queue and what it was sent."""

    queue_size: int
    queue: asyncio.Queue[T] = field(init=False)
    needs_resync: bool = True
    connected_at: float = field(default_factory=time.time)
    last_sent_seq: int = 0
    frames: int = 0
    bytes: int = 0
    drops: int = 0
    resyncs: int = 0
    sending: bool = False  # inside a send (a stalled peer stays here)

    def __post_init__(self) -> None:
        self.queue = asyncio.Queue(self.queue_size)

    def clear(self) -> None:
        """Forget what is queued."""
        while not self.queue.empty():
            self.queue.get_nowait()


@dataclass
class BroadcastCounts:
    """What every broadcaster counts (an owner may add its own fields)."""

    frames: int = counter("Messages sent to websocket clients.")
    bytes: int = counter("Bytes of messages sent to websocket clients.")
    drops: int = counter("Times a client's full queue was dropped (it resyncs).")
    resyncs: int = counter("Resyncs a client asked for or was given after a drop.")
    disconnects: int = counter("Websocket clients that went away.")
    refused: int = counter("Client messages refused (too big, malformed, rate limit).")


class Broadcaster(Generic[T]):
    """The subscribers of one stream and the counters of its fan-out.

    ``seq_of``: the sequence number a sent message carries (kept per
    subscriber as ``last_sent_seq``, for the lag figures)."""

    def __init__(
        self, counts: BroadcastCounts | None = None, seq_of: Callable[[T], int] | None = None
    ) -> None:
        self.subscribers: set[Subscriber[T]] = set()
        self.counts = counts if counts is not None else BroadcastCounts()
        self.seq_of: Callable[[T], int] | None = seq_of

    def __len__(self) -> int:
        return len(self.subscribers)

    def __iter__(self) -> Iterator[Subscriber[T]]:
        return iter(list(self.subscribers))

    def add(self, sub: Subscriber[T]) -> Subscriber[T]:
        self.subscribers.add(sub)
        return sub

    def remove(self, sub: Subscriber[T]) -> None:
        if sub in self.subscribers:
            self.subscribers.discard(sub)
            self.counts.disconnects += 1

    def offer(self, sub: Subscriber[T], item: T) -> bool:
        """Queue ``item`` for ``sub``; False when its queue was full (then
        emptied: it needs a resync)."""
        try:
            sub.queue.put_nowait(item)
        except asyncio.QueueFull:
            sub.clear()
            sub.needs_resync = True
            sub.drops += 1
            self.counts.drops += 1
            return False
        return True

    def resync(self, sub: Subscriber[T], notice: T | None = None) -> None:
        """Drop what ``sub`` has queued and count a resync; ``notice`` (what
        tells it to catch up) is queued at once, else it ``needs_resync``."""
        sub.clear()
        sub.resyncs += 1
        self.counts.resyncs += 1
        if notice is None:
            sub.needs_resync = True
        else:
            sub.queue.put_nowait(notice)
            sub.needs_resync = False

    def publish(self, item: T, notice: Callable[[], T]) -> None:
        """The same ``item`` to everyone; a subscriber too slow for it is
        given ``notice()`` instead (made once, only when needed)."""
        made: list[T] = []
        for sub in list(self.subscribers):
            if self.offer(sub, item):
                sub.needs_resync = False
                continue
            if not made:
                made.append(notice())
            self.resync(sub, made[0])

    def sent(self, sub: Subscriber[T], item: T) -> None:
        """Count ``item`` as sent to ``sub`` (its socket took it)."""
        n = len(item)
        sub.frames += 1
        sub.bytes += n
        if self.seq_of is not None:
            sub.last_sent_seq = self.seq_of(item)
        self.counts.frames += 1
        self.counts.bytes += n

    def max_lag(self, seq: int) -> int:
        """How far behind ``seq`` the slowest subscriber's last message is."""
        return max((seq - s.last_sent_seq for s in self.subscribers), default=0)
