"""The pool's free order: "append_all" (vLLM 0.16.0, default) and
"uncached_first" (vLLM >= 0.24), and the queue stamps that follow it."""

from __future__ import annotations

import contextlib
import random

import pytest

from blockpool import (
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    NotEnoughBlocksError,
    RequestManager,
    check_invariants,
)
from blockpool.core.free_order import FREE_ORDERS, QueueStamps, check_free_order
from blockpool.shadow import make_shadow
from tests.blockpool.helpers import ids, req


def queue(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def worked_example(free_order: str) -> tuple[BlockPool, list[int], list[int]]:
    """SPEC.md §5's example; returns the pool and the queue after each free."""
    pool = BlockPool(11, True, 4, free_order=free_order)
    a = req(list(range(10)))
    ab = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, ab, 0, 2, 4, 0)
    b = req([*range(8), 99, 98, 97, 96, 95])
    hit = [blocks[0] for h in b.block_hashes[:2] if (blocks := pool.get_cached_block(h, [0]))]
    pool.touch(hit)
    bn = pool.get_new_blocks(1)
    pool.cache_full_blocks(b, hit + bn, 2, 3, 4, 0)
    pool.free_blocks(reversed(ab))
    after_a = queue(pool)
    pool.free_blocks(reversed(hit + bn))
    return pool, after_a, queue(pool)


def test_default_is_vllm_016() -> None:
    pool, after_a, after_b = worked_example("append_all")
    assert BlockPool(4, True, 4).free_order == "append_all"
    assert after_a == [5, 6, 7, 8, 9, 10, 3]
    assert after_b == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]
    check_invariants(pool)


def test_uncached_first_puts_hashless_blocks_at_the_head() -> None:
    pool, after_a, after_b = worked_example("uncached_first")
    # A's block 3 holds 2 tokens, no hash: it is reused first.
    assert after_a == [3, 5, 6, 7, 8, 9, 10]
    # B's blocks are all hashed: to the tail, the chain's end first.
    assert after_b == [3, 5, 6, 7, 8, 9, 10, 4, 2, 1]
    assert ids(pool.get_new_blocks(2)) == [3, 5]
    check_invariants(pool)


def test_uncached_first_keeps_the_given_order_within_each_end() -> None:
    pool = BlockPool(9, True, 2, free_order="uncached_first")
    blocks = pool.get_new_blocks(6)  # ids 1..6
    r = req(list(range(6)), bs=2)
    pool.cache_full_blocks(r, [blocks[0], blocks[2], blocks[4]], 0, 3, 2, 0)  # 1, 3, 5 hashed
    pool.free_blocks([blocks[5], blocks[4], blocks[1], blocks[0], blocks[3], blocks[2]])
    # freed: 6 (-), 5 (#), 2 (-), 1 (#), 4 (-), 3 (#)
    assert queue(pool) == [6, 2, 4, 7, 8, 5, 1, 3]
    check_invariants(pool)


def test_caching_off_sends_every_freed_block_to_the_head() -> None:
    pool = BlockPool(6, False, 4, free_order="uncached_first")
    got = pool.get_new_blocks(3)
    pool.free_blocks(reversed(got))
    assert queue(pool) == [3, 2, 1, 4, 5]
    # with caching off a block with a (stale) hash still goes to the head
    blk = pool.get_new_blocks(1)[0]
    blk._block_hash = b"x" * 36  # type: ignore[assignment]
    pool.free_blocks([blk])
    assert queue(pool)[0] == blk.block_id
    blk._block_hash = None
    check_invariants(pool)


def test_null_block_and_shared_blocks_are_not_queued() -> None:
    pool = BlockPool(5, True, 4, free_order="uncached_first")
    b = pool.get_new_blocks(2)
    pool.touch([b[0]])  # held twice
    pool.free_blocks([pool.null_block, b[0], b[1]])
    assert queue(pool) == [2, 3, 4] and b[0].ref_cnt == 1
    pool.free_blocks([b[0]])
    assert queue(pool) == [1, 2, 3, 4]
    check_invariants(pool)


def test_strict_checks_come_first_and_change_nothing() -> None:
    from blockpool import DoubleFreeError

    pool = BlockPool(5, True, 4, strict=True, free_order="uncached_first")
    b = pool.get_new_blocks(2)
    with pytest.raises(DoubleFreeError):
        pool.free_blocks([b[0], b[0]])
    assert queue(pool) == [3, 4] and b[0].ref_cnt == 1
    pool.free_blocks(b)
    assert queue(pool) == [1, 2, 3, 4]
    check_invariants(pool)


def test_unknown_free_order_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown free order 'lifo'"):
        BlockPool(4, True, 4, free_order="lifo")
    assert check_free_order("uncached_first") == "uncached_first"
    assert FREE_ORDERS == ("append_all", "uncached_first")


def test_prepend_n_keeps_order_and_links() -> None:
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeKVCacheBlockQueue(blocks[:3])
    q.prepend_n([])
    q.prepend_n([blocks[4], blocks[3]])
    assert [b.block_id for b in q.get_all_free_blocks()] == [4, 3, 0, 1, 2]
    assert q.num_free_blocks == 5
    assert blocks[0].prev_free_block is blocks[3]
    assert blocks[4].prev_free_block is q.fake_free_list_head
    empty = FreeKVCacheBlockQueue([])
    empty.prepend_n([blocks[5]])
    assert empty.popleft() is blocks[5] and empty.num_free_blocks == 0


def test_manager_frees_as_its_pool_orders() -> None:
    pool = BlockPool(12, True, 4, free_order="uncached_first")
    mgr = RequestManager(pool, 4)
    mgr.admit("a", list(range(10)))  # blocks 1, 2 cached, 3 partial
    mgr.admit("b", list(range(100, 106)))  # 4 cached, 5 partial
    mgr.finish("a")
    assert queue(pool) == [3, 6, 7, 8, 9, 10, 11, 2, 1]
    mgr.finish("b")
    assert queue(pool) == [5, 3, 6, 7, 8, 9, 10, 11, 2, 1, 4]
    check_invariants(pool)


# ------------------------------------------------------------------ stamps


def sorted_by_stamp(pool: BlockPool, col: list[int]) -> list[int]:
    free = [b.block_id for b in pool.blocks if b.ref_cnt == 0 and not b.is_null]
    return sorted(free, key=lambda i: (col[i], i))


@pytest.mark.parametrize("free_order", FREE_ORDERS)
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_stamps_sorted_are_the_queue(free_order: str, caching: bool, seed: int) -> None:
    rng = random.Random(seed)
    pool = BlockPool(rng.randint(6, 40), caching, 2, free_order=free_order)
    mgr = RequestManager(pool, 2, group_ids=range(rng.choice([1, 2])))
    n = pool.num_gpu_blocks
    col = list(range(n))
    stamps = QueueStamps(free_order, caching, low=0, high=n)
    prefixes = [[rng.randrange(30) for _ in range(rng.randint(0, 9))] for _ in range(4)]
    live: list[str] = []
    lowest = 0
    for step in range(200):
        if rng.random() < 0.5 or not live:
            toks = rng.choice(prefixes) + [rng.randrange(30) for _ in range(rng.randint(1, 7))]
            try:
                mgr.admit(f"r{step}", toks)
                live.append(f"r{step}")
            except NotEnoughBlocksError:
                pass
        elif rng.random() < 0.5:
            rid = rng.choice(live)
            with contextlib.suppress(NotEnoughBlocksError):
                mgr.append_tokens(rid, [rng.randrange(30) for _ in range(rng.randint(1, 4))])
        else:
            rid = live.pop(rng.randrange(len(live)))
            tables = [list(t) for t in mgr.get(rid).block_tables]
            mgr.finish(rid)
            for t in tables:
                stamps.stamp_freed(reversed(t), col)
        assert sorted_by_stamp(pool, col) == queue(pool)
        lowest = min(lowest, stamps.low)
    if free_order == "append_all":
        assert stamps.low == 0  # the tail only: stamps only grow
    elif not caching:
        assert lowest < 0  # head entries went below the start-up stamps
    check_invariants(pool)


def test_stamp_queue_stamps_head_first_from_high() -> None:
    pool = BlockPool(5, True, 4)
    col = [0] * 5
    st = QueueStamps("append_all", True, low=0, high=10)
    assert st.stamp_queue(pool.free_block_queue, col) == 4
    assert col == [0, 10, 11, 12, 13] and st.high == 14


# ------------------------------------------------------------------ shadow


@pytest.mark.parametrize("seed", range(8))
def test_uncached_first_shadow_matches_the_pool(seed: int) -> None:
    rng = random.Random(seed)
    n, bs = rng.randint(8, 50), rng.choice([2, 4])
    pool = BlockPool(n, True, bs, free_order="uncached_first")
    mgr = RequestManager(pool, bs)
    shadow = make_shadow("uncached_first", n - 1, bs, 1)
    prefixes = [[rng.randrange(40) for _ in range(rng.randint(0, 20))] for _ in range(5)]
    running: list[str] = []
    for step in range(250):
        if rng.random() < 0.5 or not running:
            toks = rng.choice(prefixes) + [rng.randrange(40) for _ in range(rng.randint(1, 9))]
            rid = f"r{step}"
            try:
                adm = mgr.admit(rid, toks)
            except NotEnoughBlocksError:
                continue
            assert shadow.admit(rid, list(mgr.get(rid).block_hashes), len(toks)) == (
                adm.num_hit_blocks
            )
            assert shadow.requests[rid].tables == adm.block_ids
            running.append(rid)
        else:
            rid = running.pop(rng.randrange(len(running)))
            mgr.finish(rid)
            shadow.finish(rid)
        assert shadow.policy.order() == queue(pool)
    shadow.check()
    check_invariants(pool)
