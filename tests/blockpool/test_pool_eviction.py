"""BlockPool (non-strict, vLLM 0.16.0 behaviour): evicting hashes
(evict_blocks) and resetting the prefix cache."""

from __future__ import annotations

import logging

import pytest

from blockpool import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    KVCacheBlock,
    KVCacheMetricsCollector,
    PoolAssertionError,
    Request,
    check_invariants,
)
from tests.blockpool.helpers import Mapped, QIds, Snap, as_int, key, refs, req

# ------------------------------------------------------------------- evict


def test_evict_blocks(qids: QIds, mapped: Mapped) -> None:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True)
    r = req([1, 2, 3, 4, 5, 6], 2)
    h = r.block_hashes
    t = pool.get_new_blocks(3)
    pool.cache_full_blocks(r, t, 0, 3, 2, 0)
    pool.free_blocks([t[2]])
    pool.take_events()
    assert qids(pool) == [4, 5, 3]
    pool.evict_blocks({3, 1, 4})  # free+hashed, held+hashed, unhashed
    assert sorted(pool.take_events(), key=repr) == sorted(
        [BlockRemoved([as_int(h[2])], "GPU"), BlockRemoved([as_int(h[0])], "GPU")], key=repr
    )
    # Only the hash goes: refs and queue places stay.
    assert refs(pool) == [0, 1, 1, 0, 0, 0] and qids(pool) == [4, 5, 3]
    assert mapped(pool) == {key(h[1]): ("one", [2])}
    assert pool.blocks[1].block_hash is None and pool.blocks[3].block_hash is None
    pool.evict_blocks([2, 2])  # the second time there is nothing left
    assert pool.take_events() == [BlockRemoved([as_int(h[1])], "GPU")]
    pool.evict_blocks([])
    # An evicted held block can be cached again.
    pool.cache_full_blocks(r, t, 0, 2, 2, 0)
    assert mapped(pool) == {key(h[0]): ("one", [1]), key(h[1]): ("one", [2])}
    pool.free_blocks(t[:2])
    check_invariants(pool)


def test_evict_blocks_ids_out_of_range(snapshot: Snap, mapped: Mapped) -> None:
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    r = req([1, 2, 3, 4, 5, 6], 2)
    t = pool.get_new_blocks(3)
    pool.cache_full_blocks(r, t, 0, 3, 2, 0)
    pool.take_events()
    before = snapshot(pool)
    with pytest.raises(PoolAssertionError, match="Invalid block_id 4 >= 4"):
        pool.evict_blocks([4])
    assert snapshot(pool) == before
    # vLLM asserts only the upper bound: -1 is the last block.
    pool.evict_blocks([-1])
    assert pool.take_events() == [BlockRemoved([as_int(r.block_hashes[2])], "GPU")]
    assert list(mapped(pool).values()) == [("one", [1]), ("one", [2])]
    pool.free_blocks(t)
    check_invariants(pool)


def test_evicting_one_copy_keeps_the_other(mapped: Mapped) -> None:
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    r = req([1, 2], 2)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(r, a, 0, 1, 2, 0)
    pool.cache_full_blocks(r, b, 0, 1, 2, 0)
    pool.take_events()
    pool.evict_blocks([2, 1])
    h = as_int(r.block_hashes[0])
    assert pool.take_events() == [BlockRemoved([h], "GPU"), BlockRemoved([h], "GPU")]
    assert mapped(pool) == {}
    pool.free_blocks(a + b)
    check_invariants(pool)


# ------------------------------------------------------------------- reset


def _cached_pool() -> tuple[BlockPool, KVCacheMetricsCollector, list[KVCacheBlock], Request]:
    mc = KVCacheMetricsCollector(1.0, clock=lambda: 0)
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True, metrics_collector=mc)
    r = req([1, 2, 3, 4, 5], 2)
    t = pool.get_new_blocks(3)
    pool.cache_full_blocks(r, t, 0, 2, 2, 0)
    pool.evict_blocks([3])  # queues one metrics sample
    pool.take_events()
    return pool, mc, t, r


def test_reset_refused_while_blocks_are_held(
    snapshot: Snap, caplog: pytest.LogCaptureFixture
) -> None:
    pool, mc, t, _ = _cached_pool()
    pool.free_blocks(t[1:])
    before = snapshot(pool)
    with caplog.at_level(logging.WARNING, logger="blockpool"):
        assert pool.reset_prefix_cache() is False
    assert snapshot(pool) == before
    assert len(mc._eviction_events) == 1 and len(mc.block_metrics) == 2
    assert any("not freed yet" in m and "(1)" in m for m in caplog.messages)
    pool.free_blocks(t[:1])
    check_invariants(pool)


def test_reset_accepted_when_nothing_is_held(qids: QIds, mapped: Mapped) -> None:
    pool, mc, t, r = _cached_pool()
    pool.free_blocks(reversed(t))
    pool.touch([pool.null_block])  # the null block's count does not matter
    order = qids(pool)
    assert order == [4, 5, 3, 2, 1]
    old_map = pool.cached_block_hash_to_block
    assert pool.reset_prefix_cache() is True
    assert pool.cached_block_hash_to_block is not old_map and mapped(pool) == {}
    assert all(b.block_hash is None for b in pool.blocks)
    assert qids(pool) == order  # queue order untouched
    assert mc.block_metrics == {} and mc.drain_events() == []
    assert pool.take_events() == [AllBlocksCleared()]
    assert pool.get_cached_block(r.block_hashes[0], [0]) is None
    # Blocks can be cached again afterwards.
    t2 = pool.get_new_blocks(1)
    pool.cache_full_blocks(r, t2, 0, 1, 2, 0)
    assert mapped(pool) == {key(r.block_hashes[0]): ("one", [4])}
    pool.free_blocks(t2)
    check_invariants(pool)
