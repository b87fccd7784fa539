"""BlockPool (non-strict, vLLM 0.16.0 behaviour): caching full blocks (the
hash map, BlockStored events, duplicates, coarse blocks) and lookups across
groups."""

from __future__ import annotations

import pytest

from blockpool import (
    BlockPool,
    BlockRemoved,
    BlockStored,
    LoRARequest,
    PoolAssertionError,
    check_invariants,
)
from tests.blockpool.helpers import Mapped, QIds, Snap, as_int, ids, key, req

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
