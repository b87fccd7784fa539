"""Bounded, sequenced logs: KV events and eviction samples.

Every entry gets the next sequence number (from 1).  When a log is full the
oldest entries go and are counted as dropped; a reader asking for entries the
log no longer holds is told so (``truncated`` and the oldest seq held).

A log can also be bounded by weight (``max_weight`` with a ``weigh``
function): the KV-event log weighs each event by the tokens and hashes it
carries, so that a few huge admissions cannot make it grow without bound
while it is still under its count.  The newest entry always stays.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Generic, TypeVar

T = TypeVar("T")


class SeqLog(Generic[T]):
    def __init__(
        self,
        capacity: int,
        max_weight: int | None = None,
        weigh: Callable[[T], int] | None = None,
    ) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        if (max_weight is None) != (weigh is None):
            raise ValueError("a weight bound needs both max_weight and weigh")
        if max_weight is not None and max_weight <= 0:
            raise ValueError("max_weight must be positive")
        self.capacity = capacity
        self._items: deque[tuple[int, float, T]] = deque(maxlen=capacity)
        self.last_seq = 0
        self.dropped = 0
        self.max_weight = max_weight
        self._weigh = weigh
        self._weights: deque[int] = deque()
        self.weight = 0  # of the entries held (0 without a weight bound)

    def extend(self, ts: float, items: Iterable[T]) -> None:
        seq = self.last_seq
        log = self._items
        weigh = self._weigh
        if weigh is None:
            for item in items:
                seq += 1
                if len(log) == self.capacity:
                    self.dropped += 1
                log.append((seq, ts, item))
            self.last_seq = seq
            return
        weights = self._weights
        for item in items:
            seq += 1
            if len(log) == self.capacity:  # the deque drops its oldest entry
                self.dropped += 1
                self.weight -= weights.popleft()
            log.append((seq, ts, item))
            w = weigh(item)
            weights.append(w)
            self.weight += w
        self.last_seq = seq
        limit = self.max_weight
        assert limit is not None
        while self.weight > limit and len(log) > 1:
            log.popleft()
            self.weight -= weights.popleft()
            self.dropped += 1

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
        n = len(items)
        stop = min(n, start + limit)
        if stop <= start:
            return [], truncated
        if start < n - stop:
            return list(islice(items, start, stop)), truncated
        # nearer the newest end (a reader keeping up: the common case): walk
        # from there, not past every older entry the log holds
        out = list(islice(reversed(items), n - stop, n - start))
        out.reverse()
        return out, truncated

    def clear(self) -> None:
        self._items.clear()
        self._weights.clear()
        self.weight = 0
