"""Sampled block-residency metrics, as vLLM's KVCacheMetricsCollector.

A block is sampled at allocation with probability ``sample_rate``; a sampled
block records its birth and its last four accesses.  When the pool re-uses the
block (or evicts it) the collector queues a ``KVCacheEvictionEvent`` with the
lifetime, the idle time before eviction and the gaps between kept accesses.

Defaults match vLLM (``random.random`` and ``time.monotonic_ns``, looked up at
call time so that patching them works); tests may inject ``clock`` (a function
returning nanoseconds) and ``rng`` (a function returning floats in [0, 1)).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blockpool.core.errors import PoolAssertionError

if TYPE_CHECKING:
    from blockpool.core.block import KVCacheBlock

Clock = Callable[[], int]
Rng = Callable[[], float]


@dataclass
class KVCacheEvictionEvent:
    """One eviction sample."""

    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: tuple[float, ...]


class BlockMetricsState:
    """Lifecycle timestamps of one sampled block (nanoseconds)."""

    __slots__ = ("_clock", "access_history", "birth_time_ns", "last_access_ns")

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock
        now_ns = clock() if clock is not None else time.monotonic_ns()
        self.birth_time_ns = now_ns
        self.last_access_ns = now_ns
        self.access_history: deque[int] = deque(maxlen=4)

    def _now(self) -> int:
        clock = self._clock
        return clock() if clock is not None else time.monotonic_ns()

    def record_access(self) -> None:
        now_ns = self._now()
        self.last_access_ns = now_ns
        self.access_history.append(now_ns)

    def get_lifetime_seconds(self) -> float:
        return (self._now() - self.birth_time_ns) / 1e9

    def get_idle_time_seconds(self) -> float:
        return (self._now() - self.last_access_ns) / 1e9

    def get_reuse_gaps_seconds(self) -> list[float]:
        history = self.access_history
        if len(history) < 2:
            return []
        h = list(history)
        return [(h[i] - h[i - 1]) / 1e9 for i in range(1, len(h))]


class KVCacheMetricsCollector:
    """Collects sampled block-residency metrics."""

    def __init__(
        self,
        sample_rate: float = 0.01,
        *,
        clock: Clock | None = None,
        rng: Rng | None = None,
    ) -> None:
        if not (isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1.0):
            raise PoolAssertionError(f"sample_rate must be in (0, 1.0], got {sample_rate}")
        self.sample_rate = sample_rate
        self.clock = clock
        self.rng = rng
        self.block_metrics: dict[int, BlockMetricsState] = {}
        self._eviction_events: list[KVCacheEvictionEvent] = []

    def random_fn(self) -> Rng:
        """The random source in use now."""
        return self.rng if self.rng is not None else random.random

    def should_sample_block(self) -> bool:
        return self.random_fn()() < self.sample_rate

    def on_block_allocated(self, block: KVCacheBlock) -> None:
        if self.should_sample_block():
            self.block_metrics[block.block_id] = BlockMetricsState(self.clock)

    def on_block_accessed(self, block: KVCacheBlock) -> None:
        state = self.block_metrics.get(block.block_id)
        if state is not None:
            state.record_access()

    def on_block_evicted(self, block: KVCacheBlock) -> None:
        state = self.block_metrics.pop(block.block_id, None)
        if state is not None:
            self._record_eviction(state)

    def _record_eviction(self, state: BlockMetricsState) -> None:
        self._eviction_events.append(
            KVCacheEvictionEvent(
                lifetime_seconds=state.get_lifetime_seconds(),
                idle_seconds=state.get_idle_time_seconds(),
                reuse_gaps_seconds=tuple(state.get_reuse_gaps_seconds()),
            )
        )

    def reset(self) -> None:
        """Drop every state and every undrained sample (prefix cache reset)."""
        self.block_metrics.clear()
        self._eviction_events.clear()

    def drain_events(self) -> list[KVCacheEvictionEvent]:
        events = self._eviction_events
        self._eviction_events = []
        return events
