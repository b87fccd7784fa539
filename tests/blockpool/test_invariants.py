"""check_invariants: a clean pool passes, each kind of corruption is named."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from blockpool import (
    BlockPool,
    BlockPoolError,
    InvariantError,
    KVCacheBlock,
    Request,
    check_invariants,
    get_request_block_hasher,
    make_block_hash_with_group_id,
    sha256,
)
from blockpool.core.invariants import in_map


def busy_pool() -> tuple[BlockPool, list[KVCacheBlock]]:
    """8 blocks: 1-3 held (1, 2 cached), 4 cached and free, 5-7 free."""
    pool = BlockPool(8, True, 2, enable_kv_cache_events=True)
    r = Request("r", [1, 2, 3, 4, 5, 6, 7, 8], block_hasher=get_request_block_hasher(2, sha256))
    t = pool.get_new_blocks(4)
    pool.cache_full_blocks(r, t, 0, 2, 2, 0)
    pool.cache_full_blocks(r, t, 3, 4, 2, 0)
    pool.free_blocks([t[3]])
    return pool, t[:3]


def fails(pool: BlockPool, *fragments: str) -> InvariantError:
    with pytest.raises(InvariantError) as info:
        check_invariants(pool)
    text = str(info.value)
    for f in fragments:
        assert f in text, text
    return info.value


def test_clean_pools_pass() -> None:
    check_invariants(BlockPool(1, True, 2))
    check_invariants(BlockPool(5, False, 2))
    pool, held = busy_pool()
    check_invariants(pool)
    pool.free_blocks(reversed(held))
    check_invariants(pool)
    assert pool.reset_prefix_cache()
    check_invariants(pool)


def test_error_type_and_problem_list() -> None:
    pool, _ = busy_pool()
    pool.free_block_queue.num_free_blocks += 1
    err = fails(pool, "1 invariant violation(s)", "num_free_blocks is 5 but the queue holds 4")
    assert isinstance(err, AssertionError) and isinstance(err, BlockPoolError)
    assert err.problems == ["num_free_blocks is 5 but the queue holds 4 blocks"]
    assert "queue head->tail: [5, 6, 7, 4] (4)" in str(err)
    assert "held: 1(ref 1), 2(ref 1), 3(ref 1)" in str(err)


def test_broken_back_link() -> None:
    pool, _ = busy_pool()
    pool.blocks[6].prev_free_block = pool.blocks[7]
    fails(pool, "queue link broken: block 6.prev is 7, expected 5")


def test_cycle_in_the_queue() -> None:
    pool, _ = busy_pool()
    pool.blocks[6].next_free_block = pool.blocks[5]
    fails(pool, "block 5 is in the queue twice")


def test_queue_not_reaching_the_tail() -> None:
    pool, _ = busy_pool()
    pool.blocks[7].next_free_block = None
    fails(pool, "queue ends without reaching the tail sentinel after block 7")


def test_tail_sentinel_pointing_elsewhere() -> None:
    pool, _ = busy_pool()
    pool.free_block_queue.fake_free_list_tail.prev_free_block = pool.blocks[6]
    fails(pool, "tail sentinel's prev is 6, expected 4")


def test_foreign_block_in_the_queue() -> None:
    pool, _ = busy_pool()
    stranger = KVCacheBlock(5)
    pool.blocks[7].next_free_block = stranger
    stranger.prev_free_block = pool.blocks[7]
    stranger.next_free_block = pool.blocks[4]
    fails(pool, "queue holds a block not of this pool")


def test_ref_counts_that_disagree_with_the_queue() -> None:
    pool, held = busy_pool()
    pool.blocks[5].ref_cnt = 2
    held[1].ref_cnt = 0
    err = fails(pool, "free block 5 has ref_cnt 2", "block 2 is out of the queue with ref_cnt 0")
    assert len(err.problems) == 2


def test_held_block_with_stale_links() -> None:
    pool, held = busy_pool()
    held[0].next_free_block = pool.blocks[5]
    fails(pool, "held block 1 still has queue links")


def test_null_block_problems() -> None:
    pool, _ = busy_pool()
    pool.null_block._block_hash = pool.blocks[1].block_hash
    fails(pool, "the null block has a hash")
    pool, _ = busy_pool()
    pool.free_block_queue.append(pool.null_block)
    fails(pool, "the null block is in the free queue")
    pool, _ = busy_pool()
    pool.blocks[3].is_null = True
    fails(pool, "block 3 is marked null")
    pool, _ = busy_pool()
    pool.null_block = pool.blocks[1]
    fails(pool, "the null block must be block 0")


def test_block_ids_must_match_positions() -> None:
    pool, _ = busy_pool()
    pool.blocks[6].block_id = 9
    fails(pool, "blocks[6] has block_id 9")


def test_hash_without_map_entry() -> None:
    pool, _ = busy_pool()
    key = pool.blocks[4].block_hash
    assert key is not None and in_map(pool, key) == frozenset({4})
    del pool.cached_block_hash_to_block._cache[key]
    assert in_map(pool, key) == frozenset()
    fails(pool, "block 4 has hash", "but the map does not hold it")


def test_map_entries_that_disagree_with_blocks() -> None:
    pool, _ = busy_pool()
    cache = pool.cached_block_hash_to_block._cache
    key = make_block_hash_with_group_id(sha256("x"), 0)
    cache[key] = pool.blocks[5]  # block 5 has no hash
    fails(pool, "block 5 is filed under a key that is not its hash")

    pool, _ = busy_pool()
    cache = pool.cached_block_hash_to_block._cache
    cache[key] = {}
    fails(pool, "maps to an empty dict")

    pool, _ = busy_pool()
    cache = pool.cached_block_hash_to_block._cache
    cache[key] = {7: pool.blocks[6]}
    fails(pool, "files KVCacheBlock(block_id=6")

    pool, _ = busy_pool()
    cache = pool.cached_block_hash_to_block._cache
    foreign = KVCacheBlock(6, _block_hash=key)
    cache[key] = foreign
    fails(pool, "the map holds block 6 which is not of this pool")

    pool, _ = busy_pool()
    pool.cached_block_hash_to_block._cache[key] = pool.null_block
    fails(pool, "the null block is in the hash map")


def test_many_problems_are_summarised() -> None:
    pool = BlockPool(40, True, 2)
    for b in pool.blocks[1:]:
        b.ref_cnt = 1  # every queued block now looks held
    err = fails(pool, "39 invariant violation(s)", "... and 19 more")
    assert len(err.problems) == 39


@pytest.mark.parametrize(
    "op",
    [
        lambda p: p.free_blocks([p.blocks[1]]),
        lambda p: p.touch([p.blocks[5]]),
        lambda p: p.get_new_blocks(2),
        lambda p: p.evict_blocks([1, 4]),
    ],
)
def test_ordinary_operations_keep_the_invariants(op: Callable[[BlockPool], object]) -> None:
    pool, _ = busy_pool()
    op(pool)
    check_invariants(pool)
