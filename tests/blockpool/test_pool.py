"""BlockPool (non-strict, vLLM 0.16.0 behaviour): ids, order, map, events."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from blockpool import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVCacheBlock,
    KVCacheMetricsCollector,
    LoRARequest,
    PoolAssertionError,
    Request,
    check_invariants,
    get_request_block_hasher,
    make_block_hash_with_group_id,
    sha256,
)

QIds = Callable[[BlockPool], list[int]]
Snap = Callable[[BlockPool], dict[str, Any]]
Mapped = Callable[[BlockPool], dict[bytes, tuple[str, list[int]]]]


def req(tokens: list[int], bs: int = 4, lora: LoRARequest | None = None) -> Request:
    hasher = get_request_block_hasher(bs, sha256)
    return Request("r", tokens, block_hasher=hasher, lora_request=lora)


def key(h: bytes, gid: int = 0) -> bytes:
    return make_block_hash_with_group_id(h, gid)  # type: ignore[arg-type]


def as_int(h: bytes) -> int:
    return int.from_bytes(h[-8:], "big")


def ids(blocks: list[KVCacheBlock] | None) -> list[int] | None:
    return None if blocks is None else [b.block_id for b in blocks]


def refs(pool: BlockPool) -> list[int]:
    return [b.ref_cnt for b in pool.blocks]


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


# ------------------------------------------------------------------ caching


def test_cache_full_blocks_skips_null_blocks_and_ranges_tokens(mapped: Mapped) -> None:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True)
    r = req([10, 11, 12, 13, 14, 15, 16], 2, LoRARequest("fr", 4))
    h = r.block_hashes
    table = [pool.null_block, *pool.get_new_blocks(3)]  # e.g. outside a window
    pool.cache_full_blocks(r, table, 0, 3, 2, 0)
    assert mapped(pool) == {key(h[1]): ("one", [1]), key(h[2]): ("one", [2])}
    assert pool.null_block.block_hash is None
    assert pool.take_events() == [
        BlockStored([as_int(h[1]), as_int(h[2])], None, [10, 11, 12, 13, 14, 15], 2, 4, "GPU", "fr")
    ]
    pool.cache_full_blocks(r, table, 3, 3, 2, 0)  # nothing new: no event
    pool.cache_full_blocks(r, table, 3, 2, 2, 0)
    assert pool.take_events() == []
    r.append_output_token_ids(17)
    pool.cache_full_blocks(r, table, 3, 4, 2, 0)
    assert pool.take_events() == [
        BlockStored([as_int(h[3])], as_int(h[2]), [16, 17], 2, 4, "GPU", "fr")
    ]
    pool.free_blocks(reversed(table))
    assert 0 not in [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    check_invariants(pool)


def test_caching_a_hashed_block_again_is_an_assertion() -> None:
    pool = BlockPool(4, True, 2)
    r = req([1, 2, 3, 4], 2)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    with pytest.raises(PoolAssertionError, match="already has a hash"):
        pool.cache_full_blocks(r, blocks, 1, 2, 2, 0)
    pool.free_blocks(blocks)
    check_invariants(pool)


def test_caching_more_blocks_than_hashes_is_an_assertion(snapshot: Snap) -> None:
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    r = req([1, 2, 3], 2)  # one full block
    blocks = pool.get_new_blocks(2)
    before = snapshot(pool)
    with pytest.raises(PoolAssertionError):
        pool.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    assert snapshot(pool) == before
    pool.free_blocks(blocks)
    check_invariants(pool)


def test_duplicates_under_one_key(qids: QIds, mapped: Mapped) -> None:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True)
    x, y = req([5, 6, 7], 2), req([5, 6, 8, 9], 2)  # same first block
    hx = x.block_hashes[0]
    assert y.block_hashes[0] == hx
    bx, by = pool.get_new_blocks(1), pool.get_new_blocks(2)
    pool.cache_full_blocks(x, bx, 0, 1, 2, 0)
    pool.cache_full_blocks(y, by, 0, 2, 2, 0)
    # No de-duplication: both physical copies stay cached under one key.
    assert mapped(pool) == {key(hx): ("dict", [1, 2]), key(y.block_hashes[1]): ("one", [3])}
    assert pool.get_cached_block(hx, [0]) == [pool.blocks[1]]  # first inserted
    pool.take_events()
    pool.free_blocks(bx)
    pool.free_blocks(reversed(by))
    assert qids(pool) == [4, 5, 1, 3, 2]
    pool.get_new_blocks(3)  # 4, 5, then block 1: one copy goes
    assert pool.take_events() == [BlockRemoved([as_int(hx)], "GPU")]
    assert mapped(pool)[key(hx)] == ("dict", [2])  # still a dict
    assert pool.get_cached_block(hx, [0]) == [pool.blocks[2]]
    pool.get_new_blocks(2)  # 3 then 2: the last copy goes
    assert pool.take_events() == [
        BlockRemoved([as_int(y.block_hashes[1])], "GPU"),
        BlockRemoved([as_int(hx)], "GPU"),
    ]
    assert mapped(pool) == {} and pool.get_cached_block(hx, [0]) is None
    check_invariants(pool)


def test_coarse_caching_concatenates_fine_hashes(mapped: Mapped) -> None:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True)
    r = req(list(range(9)), 2)  # 4 fine hashes -> 2 coarse blocks of 4 tokens
    f = r.block_hashes
    assert len(f) == 4
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(r, blocks, 0, 1, 4, 1)
    pool.cache_full_blocks(r, blocks, 1, 2, 4, 1)
    c0, c1 = f[0] + f[1], f[2] + f[3]
    assert mapped(pool) == {key(c0, 1): ("one", [1]), key(c1, 1): ("one", [2])}
    assert pool.blocks[2].block_hash == c1 + b"\x00\x00\x00\x01"
    assert pool.get_cached_block(c1, [1]) == [pool.blocks[2]]
    assert pool.get_cached_block(f[2], [1]) is None
    assert pool.take_events() == [
        BlockStored([as_int(c0)], None, [0, 1, 2, 3], 4, None, "GPU", None),
        BlockStored([as_int(c1)], as_int(c0), [4, 5, 6, 7], 4, None, "GPU", None),
    ]
    assert as_int(c1) == as_int(f[3])  # the last 8 bytes of the concatenation
    with pytest.raises(PoolAssertionError):
        pool.cache_full_blocks(r, blocks, 2, 3, 5, 1)  # 5 is no multiple of 2
    pool.free_blocks(blocks)
    check_invariants(pool)


# -------------------------------------------------------------- lookups


def test_get_cached_block_is_all_or_nothing_across_groups(snapshot: Snap) -> None:
    pool = BlockPool(8, True, 2, enable_kv_cache_events=True)
    r = req([1, 2, 3, 4], 2)
    h0, h1 = r.block_hashes
    g0, g1, g2 = pool.get_new_blocks(2), pool.get_new_blocks(2), pool.get_new_blocks(1)
    pool.cache_full_blocks(r, g0, 0, 2, 2, 0)
    pool.cache_full_blocks(r, g1, 0, 2, 2, 1)
    pool.cache_full_blocks(r, g2, 0, 1, 2, 2)  # group 2 holds only the first block
    before = snapshot(pool)
    assert ids(pool.get_cached_block(h0, [0, 1, 2])) == [1, 3, 5]
    assert ids(pool.get_cached_block(h0, [2, 0])) == [5, 1]  # in the order asked
    assert ids(pool.get_cached_block(h1, [1, 0])) == [4, 2]
    assert pool.get_cached_block(h1, [0, 1, 2]) is None  # group 2 misses
    assert pool.get_cached_block(h1, [2]) is None
    assert pool.get_cached_block(h0, [3]) is None
    assert pool.get_cached_block(h0, []) == []
    assert snapshot(pool) == before  # no ref, no order, no event, no metric
    for t in (g0, g1, g2):
        pool.free_blocks(t)
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


# ------------------------------------------------------------ usage, events


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
