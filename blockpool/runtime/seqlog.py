"""Bounded, sequenced logs: KV events and eviction samples.

Every entry gets the next sequence number (from 1).  When a log is full the
oldest entries go and are counted as dropped; a reader asking for entries the
log no longer holds is told so (``truncated`` and the oldest seq held).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import islice
from typing import Generic, TypeVar

T = TypeVar("T")


class SeqLog(Generic[T]):
    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._items: deque[tuple[int, float, T]] = deque(maxlen=capacity)
        self.last_seq = 0
        self.dropped = 0

    def extend(self, ts: float, items: Iterable[T]) -> None:
        seq = self.last_seq
        log = self._items
        for item in items:
            seq += 1
            if len(log) == self.capacity:
                self.dropped += 1
            log.append((seq, ts, item))
        self.last_seq = seq

    @property
    def first_seq(self) -> int:
        """The oldest seq held (last_seq + 1 when empty)."""
        return self._items[0][0] if self._items else self.last_seq + 1

    def __len__(self) -> int:
        return len(self._items)

    def since(self, seq: int, limit: int) -> tuple[list[tuple[int, float, T]], bool]:
        """Entries with seq > ``seq`` (at most ``limit``), and whether some
        entries after ``seq`` were already dropped."""
        items = self._items
        if not items:
            return [], seq < self.last_seq
        first = items[0][0]
        truncated = seq + 1 < first
        start = max(0, seq + 1 - first)
        return list(islice(items, start, start + limit)), truncated

    def clear(self) -> None:
        self._items.clear()
