"""BlockPool (non-strict, vLLM 0.16.0 behaviour): construction, the spec's
worked example, allocation and reuse order, touch and free order, usage."""

from __future__ import annotations

from typing import Any

import pytest

from blockpool import (
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVCacheBlock,
    KVCacheMetricsCollector,
    PoolAssertionError,
    check_invariants,
)
from tests.blockpool.helpers import Mapped, QIds, Snap, as_int, ids, key, refs, req

# --------------------------------------------------------------- construction


@pytest.mark.parametrize("bad", [0, -3, 2.0, "4", None, True])
def test_num_gpu_blocks_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(PoolAssertionError):
        BlockPool(bad, enable_caching=True, hash_block_size=4)


def test_construction(qids: QIds) -> None:
    mc = KVCacheMetricsCollector(1.0)
    pool = BlockPool(5, True, 16, enable_kv_cache_events=True, metrics_collector=mc)
    assert (pool.num_gpu_blocks, pool.enable_caching, pool.hash_block_size) == (5, True, 16)
    assert pool.enable_kv_cache_events is True and pool.metrics_collector is mc
    assert [b.block_id for b in pool.blocks] == [0, 1, 2, 3, 4]
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert not any(b.is_null for b in pool.blocks[1:])
    assert qids(pool) == [1, 2, 3, 4] and pool.get_num_free_blocks() == 4
    assert pool.null_block.ref_cnt == 0  # not kept
    assert len(pool.cached_block_hash_to_block) == 0 and pool.kv_event_queue == []
    assert pool.get_usage() == 0.0
    assert mc.block_metrics == {}  # the null block is popped, not allocated
    assert pool.strict is False
    check_invariants(pool)


def test_a_pool_of_one_block_has_only_the_null_block(qids: QIds) -> None:
    pool = BlockPool(1, True, 4)
    assert qids(pool) == [] and pool.get_num_free_blocks() == 0
    assert pool.get_usage() == 0
    assert pool.get_new_blocks(0) == []
    with pytest.raises(ValueError, match="Cannot get 1 free blocks from the pool"):
        pool.get_new_blocks(1)
    assert pool.reset_prefix_cache() is True
    check_invariants(pool)


# ------------------------------------------------------------ worked example


def test_spec_worked_example_step_by_step(qids: QIds, mapped: Mapped) -> None:
    pool = BlockPool(11, enable_caching=True, hash_block_size=4, enable_kv_cache_events=True)
    a = req(list(range(10)))
    assert len(a.block_hashes) == 2  # 2 full blocks; the tail of 2 tokens has no hash
    a_blocks = pool.get_new_blocks(3)
    assert ids(a_blocks) == [1, 2, 3]
    assert refs(pool) == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    pool.cache_full_blocks(a, a_blocks, 0, 2, 4, 0)
    h0, h1 = a.block_hashes
    assert mapped(pool) == {key(h0): ("one", [1]), key(h1): ("one", [2])}
    assert pool.blocks[1].block_hash == key(h0) and pool.blocks[3].block_hash is None
    assert pool.take_events() == [
        BlockStored([as_int(h0), as_int(h1)], None, list(range(8)), 4, None, "GPU", None)
    ]
    assert qids(pool) == [4, 5, 6, 7, 8, 9, 10]

    b = req([*range(8), 100, 101, 102])
    assert b.block_hashes == a.block_hashes
    hits = [pool.get_cached_block(h, [0]) for h in b.block_hashes]
    assert [ids(h) for h in hits] == [[1], [2]]
    pool.touch([pool.blocks[1], pool.blocks[2]])
    assert refs(pool)[1:4] == [2, 2, 1]
    b_new = pool.get_new_blocks(1)
    assert ids(b_new) == [4]
    assert qids(pool) == [5, 6, 7, 8, 9, 10]

    pool.free_blocks([a_blocks[2], a_blocks[1], a_blocks[0]])
    assert refs(pool)[1:5] == [1, 1, 0, 1]
    assert qids(pool) == [5, 6, 7, 8, 9, 10, 3]

    pool.free_blocks([b_new[0], pool.blocks[2], pool.blocks[1]])
    assert qids(pool) == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]
    assert refs(pool) == [0] * 11
    assert pool.get_usage() == 0.0
    check_invariants(pool)

    # Reuse follows the queue; the shared root (block 1) goes last.
    assert ids(pool.get_new_blocks(8)) == [5, 6, 7, 8, 9, 10, 3, 4]
    assert pool.take_events() == []  # none of those was cached
    assert ids(pool.get_new_blocks(1)) == [2]
    assert pool.take_events() == [BlockRemoved([as_int(h1)], "GPU")]
    assert pool.get_cached_block(h0, [0]) == [pool.blocks[1]]
    assert pool.get_cached_block(h1, [0]) is None
    assert ids(pool.get_new_blocks(1)) == [1]
    assert pool.take_events() == [BlockRemoved([as_int(h0)], "GPU")]
    assert mapped(pool) == {} and pool.get_usage() == 1.0
    check_invariants(pool)


# ---------------------------------------------------------------- allocation


def test_get_new_blocks_beyond_free_changes_nothing(snapshot: Snap) -> None:
    pool = BlockPool(4, True, 4, enable_kv_cache_events=True)
    pool.get_new_blocks(1)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=r"^Cannot get 3 free blocks from the pool$"):
        pool.get_new_blocks(3)
    assert snapshot(pool) == before
    assert pool.get_new_blocks(0) == [] and snapshot(pool) == before
    check_invariants(pool)


def test_get_new_blocks_never_looks_up_the_cache(qids: QIds, mapped: Mapped) -> None:
    # Free cached blocks are handed out (and evicted) in queue order, even
    # when the caller could have hit them.
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    r = req([1, 2, 3, 4], bs=2)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    pool.free_blocks(reversed(blocks))
    pool.take_events()
    assert qids(pool) == [3, 2, 1]
    assert ids(pool.get_new_blocks(2)) == [3, 2]
    assert pool.take_events() == [BlockRemoved([as_int(r.block_hashes[1])], "GPU")]
    assert pool.blocks[2].block_hash is None
    assert mapped(pool) == {key(r.block_hashes[0]): ("one", [1])}
    check_invariants(pool)


def test_eviction_order_after_several_frees(qids: QIds, mapped: Mapped) -> None:
    pool = BlockPool(9, True, 2, enable_kv_cache_events=True)
    r1, r2, r3 = req([1, 2, 3, 4, 5, 6], 2), req([7, 8, 9, 10], 2), req([11, 12, 13, 14], 2)
    t1, t2, t3 = pool.get_new_blocks(3), pool.get_new_blocks(2), pool.get_new_blocks(2)
    assert (ids(t1), ids(t2), ids(t3)) == ([1, 2, 3], [4, 5], [6, 7])
    for r, t in ((r1, t1), (r2, t2), (r3, t3)):
        pool.cache_full_blocks(r, t, 0, len(t), 2, 0)
    pool.take_events()
    pool.free_blocks(reversed(t2))
    pool.free_blocks(t1)  # given order: first listed is evicted first
    pool.free_blocks(reversed(t3))
    assert qids(pool) == [8, 5, 4, 1, 2, 3, 7, 6]
    # A hit on block 2 takes it out; freed again it goes to the tail (MRU).
    hit = pool.get_cached_block(r1.block_hashes[1], [0])
    assert ids(hit) == [2]
    assert hit is not None
    pool.touch(hit)
    assert qids(pool) == [8, 5, 4, 1, 3, 7, 6]
    pool.free_blocks(hit)
    assert qids(pool) == [8, 5, 4, 1, 3, 7, 6, 2]
    assert pool.take_events() == []  # touch and free emit nothing
    assert ids(pool.get_new_blocks(8)) == [8, 5, 4, 1, 3, 7, 6, 2]
    expected_order = [r2.block_hashes[1], r2.block_hashes[0], r1.block_hashes[0]]
    expected_order += [r1.block_hashes[2], r3.block_hashes[1], r3.block_hashes[0]]
    expected_order += [r1.block_hashes[1]]
    assert pool.take_events() == [BlockRemoved([as_int(h)], "GPU") for h in expected_order]
    assert mapped(pool) == {} and qids(pool) == []
    check_invariants(pool)


def test_caching_off_neither_evicts_nor_reports_eviction() -> None:
    mc = KVCacheMetricsCollector(1.0, clock=lambda: 0)
    pool = BlockPool(3, False, 2, enable_kv_cache_events=True, metrics_collector=mc)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(blocks)
    assert ids(pool.get_new_blocks(2)) == [1, 2]
    # vLLM only evicts with caching on: the old states are overwritten,
    # and no eviction sample is queued.
    assert sorted(mc.block_metrics) == [1, 2] and mc.drain_events() == []
    assert pool.take_events() == []
    check_invariants(pool)


# ------------------------------------------------------------ touch / free


def test_touch(qids: QIds) -> None:
    mc = KVCacheMetricsCollector(1.0, clock=lambda: 7)
    pool = BlockPool(5, True, 2, enable_kv_cache_events=True, metrics_collector=mc)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks([blocks[1]])
    assert qids(pool) == [4, 2]
    pool.touch([pool.blocks[2], pool.blocks[1], pool.blocks[1]])
    assert refs(pool) == [0, 3, 1, 1, 0] and qids(pool) == [4]
    pool.touch([pool.null_block])  # never queued; its count is not meaningful
    assert qids(pool) == [4] and pool.get_num_free_blocks() == 1
    assert [len(mc.block_metrics[i].access_history) for i in (1, 2, 3)] == [2, 1, 0]
    assert pool.take_events() == []
    pool.free_blocks([pool.null_block])
    pool.free_blocks([pool.blocks[1]] * 3 + [pool.blocks[2], pool.blocks[3]])
    assert qids(pool) == [4, 1, 2, 3]
    check_invariants(pool)


def test_touching_an_unqueued_zero_ref_block_is_a_runtime_error() -> None:
    pool = BlockPool(3, True, 2)
    stray = KVCacheBlock(1)  # looks free but is in no queue
    with pytest.raises(RuntimeError, match="remove\\(\\) called on an invalid block"):
        pool.touch([stray])
    check_invariants(pool)


def test_free_blocks_appends_in_the_given_order_and_never_queues_null(qids: QIds) -> None:
    pool = BlockPool(7, True, 2)
    t = pool.get_new_blocks(6)
    pool.touch([t[2]])
    pool.free_blocks(b for b in [t[4], pool.null_block, t[2], t[0]])  # any iterable
    assert qids(pool) == [5, 1] and refs(pool)[3] == 1
    pool.free_blocks(reversed([t[1], t[2], t[3], t[5]]))
    assert qids(pool) == [5, 1, 6, 4, 3, 2]
    pool.free_blocks([])
    assert qids(pool) == [5, 1, 6, 4, 3, 2]
    check_invariants(pool)


def test_a_block_listed_twice_in_one_free_is_queued_once_at_its_last_mention(
    qids: QIds,
) -> None:
    # vLLM 0.16 decrements every count first and then appends each block at
    # 0 -- this one twice, which cuts blocks 2 and 3 out of its linked list
    # while counting them.  We keep the list whole (compare_vllm avoids it).
    pool = BlockPool(6, True, 2)
    a, b, c = pool.get_new_blocks(3)
    pool.touch([a])
    pool.free_blocks([a, b, c, a])
    assert qids(pool) == [4, 5, 2, 3, 1] and pool.get_num_free_blocks() == 5
    check_invariants(pool)


def test_non_strict_free_does_not_check_double_frees(qids: QIds) -> None:
    # As vLLM: the count goes negative and the block stays queued once.
    pool = BlockPool(4, True, 2)
    (b,) = pool.get_new_blocks(1)
    pool.free_blocks([b])
    pool.free_blocks([b])
    assert b.ref_cnt == -1 and qids(pool) == [2, 3, 1]
    with pytest.raises(AssertionError, match="free block 1 has ref_cnt -1"):
        check_invariants(pool)
    b.ref_cnt = 0
    check_invariants(pool)


# ------------------------------------------------------------------- usage


def test_usage_and_free_count() -> None:
    pool = BlockPool(5, True, 2)
    assert (pool.get_num_free_blocks(), pool.get_usage()) == (4, 0.0)
    t = pool.get_new_blocks(3)
    assert (pool.get_num_free_blocks(), pool.get_usage()) == (1, 0.75)
    r = req([1, 2], 2)
    pool.cache_full_blocks(r, t, 0, 1, 2, 0)
    pool.free_blocks(t)
    # Cached blocks with no reference count as free.
    assert (pool.get_num_free_blocks(), pool.get_usage()) == (4, 0.0)
    check_invariants(pool)
