"""BlockPool (non-strict, vLLM 0.16.0 behaviour): the event queue, and the
metrics collector's calls."""

from __future__ import annotations

from blockpool import (
    AllBlocksCleared,
    BlockPool,
    KVCacheBlock,
    KVCacheMetricsCollector,
    check_invariants,
)
from tests.blockpool.helpers import req

# ------------------------------------------------------------------ events


def test_events_off_records_nothing() -> None:
    pool = BlockPool(4, True, 2)
    r = req([1, 2, 3, 4], 2)
    t = pool.get_new_blocks(2)
    pool.cache_full_blocks(r, t, 0, 2, 2, 0)
    pool.evict_blocks([1])
    pool.free_blocks(t)
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [] and pool.kv_event_queue == []
    check_invariants(pool)


def test_take_events_hands_out_a_new_list() -> None:
    pool = BlockPool(3, True, 2, enable_kv_cache_events=True)
    pool.reset_prefix_cache()
    first = pool.kv_event_queue
    got = pool.take_events()
    assert got is first and got == [AllBlocksCleared()]
    assert pool.kv_event_queue == [] and pool.kv_event_queue is not first
    check_invariants(pool)


class RecordingCollector(KVCacheMetricsCollector):
    """A subclass: the pool must call it through its methods, in order."""

    def __init__(self) -> None:
        super().__init__(1.0, clock=lambda: 0)
        self.calls: list[tuple[str, int]] = []

    def on_block_allocated(self, block: KVCacheBlock) -> None:
        self.calls.append(("allocated", block.block_id))
        super().on_block_allocated(block)

    def on_block_accessed(self, block: KVCacheBlock) -> None:
        self.calls.append(("accessed", block.block_id))

    def on_block_evicted(self, block: KVCacheBlock) -> None:
        self.calls.append(("evicted", block.block_id))
        super().on_block_evicted(block)


def test_a_subclassed_collector_sees_every_call_in_order() -> None:
    mc = RecordingCollector()
    pool = BlockPool(4, True, 2, metrics_collector=mc)
    t = pool.get_new_blocks(2)
    pool.touch(t[:1])
    pool.free_blocks(t)
    pool.evict_blocks([3])
    assert mc.calls == [
        ("evicted", 1),
        ("allocated", 1),
        ("evicted", 2),
        ("allocated", 2),
        ("accessed", 1),
        ("evicted", 3),
    ]
    assert len(mc.drain_events()) == 0  # block 3 was never sampled
    check_invariants(pool)
