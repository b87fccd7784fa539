"""KVCacheCoordinator by hand: KV-cache groups of full attention and sliding
windows over one pool, with the block ids worked out on paper (vLLM 0.16.0's
behaviour; bench/compare_vllm_hybrid.py holds the two side by side)."""

from __future__ import annotations

import pytest

from blockpool import BlockPool, KVCacheBlock, Request, get_request_block_hasher, sha256
from blockpool.core.attention import FULL_ATTENTION, SLIDING_WINDOW, GroupSpec
from blockpool.core.coordinator import KVCacheCoordinator
from blockpool.core.invariants import InvariantError, check_coordinator, check_invariants
from tests.blockpool.helpers import Snap
from tests.conftest import queue_ids

FULL4 = GroupSpec(FULL_ATTENTION, 4)
WIN8 = GroupSpec(SLIDING_WINDOW, 4, 8)  # 8 tokens: a hit needs cdiv(7, 4) = 2 blocks


def request(rid: str, tokens: list[int], hash_block_size: int = 4) -> Request:
    return Request(rid, tokens, block_hasher=get_request_block_hasher(hash_block_size, sha256))


def coordinator(
    num_blocks: int, *specs: GroupSpec, hash_block_size: int | None = None
) -> KVCacheCoordinator:
    pool = BlockPool(num_blocks, True, hash_block_size or 4, enable_kv_cache_events=True)
    return KVCacheCoordinator(pool, specs, 1 << 12, hash_block_size=hash_block_size)


def ids(blocks: tuple[list[KVCacheBlock], ...]) -> list[list[int]]:
    return [[b.block_id for b in g] for g in blocks]


def prefill(co: KVCacheCoordinator, r: Request) -> None:
    """Look the prefix up and allocate the whole prompt, as admission does."""
    hit, n = co.find_longest_cache_hit(r.block_hashes, r.num_tokens - 1)
    got = co.allocate_slots(
        r, r.num_tokens - n, n, hit, num_computed_tokens=0, num_tokens=r.num_tokens
    )
    assert got is not None


def decode(co: KVCacheCoordinator, r: Request, token: int) -> None:
    computed = r.num_tokens
    r.append_output_token_ids(token)
    got = co.allocate_slots(r, 1, num_computed_tokens=computed, num_tokens=r.num_tokens)
    assert got is not None


TOKENS = list(range(20))  # five blocks of 4


def test_a_window_hit_is_padded_with_null_blocks() -> None:
    co = coordinator(10, WIN8)
    a = request("a", TOKENS)
    prefill(co, a)
    assert co.block_ids("a") == [[1, 2, 3, 4, 5]]
    co.free("a")
    assert queue_ids(co.pool) == [6, 7, 8, 9, 5, 4, 3, 2, 1]
    b = request("b", [*TOKENS, 99])
    hit, n = co.find_longest_cache_hit(b.block_hashes, b.num_tokens - 1)
    # the walk from the right stops at the first 2 contiguous cached blocks
    assert (ids(hit), n) == ([[0, 0, 0, 4, 5]], 20)
    got = co.allocate_slots(b, 1, 20, hit, num_computed_tokens=0, num_tokens=21)
    assert got is not None and ids(got) == [[6]]
    assert co.block_ids("b") == [[0, 0, 0, 4, 5, 6]]
    assert [co.pool.blocks[i].ref_cnt for i in range(1, 7)] == [0, 0, 0, 1, 1, 1]
    assert queue_ids(co.pool) == [7, 8, 9, 3, 2, 1]  # 1-3 still cached, not held
    check_coordinator(co)


def test_a_window_hit_is_found_right_of_an_evicted_prefix() -> None:
    co = coordinator(16, FULL4, WIN8)
    a = request("a", TOKENS)
    prefill(co, a)
    assert co.block_ids("a") == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    co.free("a")
    co.pool.evict_blocks([6, 7])  # the window group's first two blocks
    alone = coordinator(16, WIN8)
    prefill(alone, request("a", TOKENS))
    alone.free("a")
    alone.pool.evict_blocks([1, 2])
    b = request("b", [*TOKENS, 99])
    hit, n = alone.find_longest_cache_hit(b.block_hashes, 20)
    assert (ids(hit), n) == ([[0, 0, 0, 4, 5]], 20)
    # with full attention beside it the same window hit stands: the full
    # group still holds all five blocks
    hit, n = co.find_longest_cache_hit(b.block_hashes, 20)
    assert (ids(hit), n) == ([[1, 2, 3, 4, 5], [0, 0, 0, 9, 10]], 20)
    check_coordinator(co)
    check_coordinator(alone)


def test_without_a_full_run_the_leading_run_is_the_hit() -> None:
    co = coordinator(10, WIN8)
    prefill(co, request("a", TOKENS))
    co.free("a")
    co.pool.evict_blocks([2, 4])  # cached: 1, 3, 5 -- no two side by side
    b = request("b", [*TOKENS, 99])
    hit, n = co.find_longest_cache_hit(b.block_hashes, 20)
    assert (ids(hit), n) == ([[1]], 4)
    check_coordinator(co)


def test_decodes_free_the_blocks_that_leave_the_window() -> None:
    co = coordinator(10, WIN8)
    a = request("a", list(range(8)))
    prefill(co, a)
    assert co.block_ids("a") == [[1, 2]]
    for t in range(8, 11):  # computed 8..10: skipped tokens 1..3, no whole block
        decode(co, a, t)
    assert co.block_ids("a") == [[1, 2, 3]]
    decode(co, a, 11)  # computed 11: tokens 0-3 skipped, block 1 leaves first
    assert co.block_ids("a") == [[0, 2, 3]]
    assert queue_ids(co.pool) == [4, 5, 6, 7, 8, 9, 1]
    assert co.pool.blocks[1].block_hash is not None  # free, still cached
    decode(co, a, 12)  # computed 12: a fourth block, from the queue's head
    assert co.block_ids("a") == [[0, 2, 3, 4]]
    for t in range(13, 17):
        decode(co, a, t)  # computed 15: tokens 0-7 skipped, block 2 goes
    assert co.block_ids("a") == [[0, 0, 3, 4, 5]]
    assert queue_ids(co.pool) == [6, 7, 8, 9, 1, 2]
    check_coordinator(co)
    co.free("a")  # the table in reverse, the nulls left out
    assert queue_ids(co.pool) == [6, 7, 8, 9, 1, 2, 5, 4, 3]
    assert co.block_ids("a") == [[]]
    check_coordinator(co)


def test_the_window_shortens_the_full_attention_hit() -> None:
    co = coordinator(16, FULL4, WIN8)
    prefill(co, request("a", TOKENS))
    co.free("a")
    co.pool.evict_blocks([9, 10])  # the window group's last two blocks
    b = request("b", [*TOKENS, 99])
    hit, n = co.find_longest_cache_hit(b.block_hashes, 20)
    # full attention finds 20 tokens; the window's run within them ends at
    # block 8 (12 tokens), so the full group keeps its first three blocks
    assert (ids(hit), n) == ([[1, 2, 3], [0, 7, 8]], 12)
    check_coordinator(co)


def test_a_second_window_reruns_the_first() -> None:
    # three types: full, a window needing 2 blocks, one needing 3 (cdiv(11, 4))
    co = coordinator(24, FULL4, WIN8, GroupSpec(SLIDING_WINDOW, 4, 12))
    prefill(co, request("a", TOKENS))
    assert co.block_ids("a") == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    co.free("a")
    # the 12-token window keeps blocks 0-2 of its group; the 8-token window
    # loses block 2 (id 8), so its hit at 12 tokens is blocks 0-1 only
    co.pool.evict_blocks([14, 15, 8])
    b = request("b", [*TOKENS, 99])
    hit, n = co.find_longest_cache_hit(b.block_hashes, 20)
    # round 1: full 20; window 8 at 20 -> [.., 9, 10] 20; window 12 at 20 ->
    # 12 tokens.  Round 2 at 12: window 8 finds 6, 7 (8 tokens); window 12 at
    # 8 -> its leading run, 8 tokens.  Round 3 at 8: nobody shortens.
    assert (ids(hit), n) == ([[1, 2], [6, 7], [11, 12]], 8)
    check_coordinator(co)


def test_a_refused_admission_changes_nothing(snapshot: Snap) -> None:
    co = coordinator(6, FULL4, WIN8)
    prefill(co, request("a", list(range(8))))
    assert co.block_ids("a") == [[1, 2], [3, 4]]
    co.free("a")
    co.pool.take_events()
    b = request("b", list(range(17)))
    hit, n = co.find_longest_cache_hit(b.block_hashes, 16)
    assert (ids(hit), n) == ([[1, 2], [3, 4]], 8)
    before = snapshot(co.pool)
    # 3 new blocks and 2 evictable hits in each group: 10 > 5 free
    assert co.allocate_slots(b, 9, 8, hit, num_computed_tokens=0, num_tokens=17) is None
    assert snapshot(co.pool) == before
    assert co.block_ids("b") == [[], []]
    check_coordinator(co)


def test_a_refused_decode_still_frees_what_left_the_window() -> None:
    co = coordinator(5, WIN8)  # blocks 1-4
    a = request("a", list(range(16)))
    prefill(co, a)
    assert co.block_ids("a") == [[1, 2, 3, 4]]
    assert co.allocate_slots(a, 1, num_computed_tokens=16, num_tokens=17) is not None
    # computed 16: tokens 0-8 skipped, so blocks 1 and 2 are freed, last
    # first (2, then 1), before the new block is taken from the queue's head
    assert co.block_ids("a") == [[0, 0, 3, 4, 2]]
    other = request("o", list(range(100, 116)))
    # 4 blocks wanted, 1 free: refused, nothing taken
    assert co.allocate_slots(other, 16, num_computed_tokens=0, num_tokens=16) is None
    assert queue_ids(co.pool) == [1]
    check_coordinator(co)


def test_mixed_block_sizes_keep_hits_aligned() -> None:
    full8 = GroupSpec(FULL_ATTENTION, 8)
    win5 = GroupSpec(SLIDING_WINDOW, 4, 5)  # a hit needs cdiv(4, 4) = 1 block
    co = coordinator(12, full8, win5, hash_block_size=4)
    assert co.alignment == 8
    prefill(co, request("a", list(range(16)), 4))
    assert co.block_ids("a") == [[1, 2], [3, 4, 5, 6]]
    co.free("a")
    co.pool.evict_blocks([6])
    b = request("b", list(range(17)), 4)
    hit, n = co.find_longest_cache_hit(b.block_hashes, 16)
    # the window's block 2 (id 5) ends at 12 tokens, not a multiple of 8: the
    # run must end at block 1 (8 tokens); the full group keeps one block
    assert (ids(hit), n) == ([[1], [0, 4]], 8)
    got = co.allocate_slots(b, 9, 8, hit, num_computed_tokens=0, num_tokens=17)
    assert got is not None
    # computed 8: tokens 0-3 skipped, so the window group holds no block 0
    assert co.block_ids("b") == [[1, *ids(got)[0]], [0, 4, *ids(got)[1]]]
    assert [len(g) for g in ids(got)] == [2, 3]
    check_coordinator(co)


def test_eagle_drops_the_last_hit_block() -> None:
    co = coordinator(10, WIN8)
    eagle = KVCacheCoordinator(co.pool, [WIN8], 1 << 12, use_eagle=True)
    prefill(co, request("a", TOKENS))
    co.free("a")
    b = request("b", [*TOKENS, 99])
    # eagle wants 3 contiguous blocks and then drops the last one
    hit, n = eagle.find_longest_cache_hit(b.block_hashes, 20)
    assert (ids(hit), n) == ([[0, 0, 3, 4]], 16)
    check_invariants(co.pool)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "mamba"}, "unknown attention kind 'mamba'"),
        ({"block_size": 0}, "block_size must be positive, got 0"),
        ({"kind": SLIDING_WINDOW}, "a sliding-window group needs a positive sliding_window"),
        ({"kind": SLIDING_WINDOW, "sliding_window": 0}, "needs a positive sliding_window"),
        ({"sliding_window": 8}, "a full-attention group has no sliding_window"),
    ],
)
def test_group_spec_refuses_what_it_cannot_model(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GroupSpec(**kwargs)  # type: ignore[arg-type]


def test_coordinator_refuses_bad_groups() -> None:
    pool = BlockPool(8, True, 4)
    with pytest.raises(ValueError, match="at least one KV-cache group"):
        KVCacheCoordinator(pool, [], 64)
    with pytest.raises(ValueError, match="multiple of the hash block size"):
        KVCacheCoordinator(pool, [FULL4, GroupSpec(FULL_ATTENTION, 6)], 64, hash_block_size=4)
    check_invariants(pool)


def test_groups_are_cached_under_the_given_group_ids() -> None:
    pool = BlockPool(16, True, 4, enable_kv_cache_events=True)
    co = KVCacheCoordinator(pool, [FULL4, WIN8], 1 << 12, group_ids=(5, 2))
    a = request("a", TOKENS)
    prefill(co, a)
    assert co.block_ids("a") == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    h = a.block_hashes
    assert pool.get_cached_block(h[3], [5, 2]) == [pool.blocks[4], pool.blocks[9]]
    assert pool.get_cached_block(h[3], [0]) is None
    b = request("b", [*TOKENS, 99])
    hit, n = co.find_longest_cache_hit(b.block_hashes, 20)
    assert (ids(hit), n) == ([[1, 2, 3, 4, 5], [0, 0, 0, 9, 10]], 20)
    check_coordinator(co)
    with pytest.raises(ValueError, match="distinct, one per group"):
        KVCacheCoordinator(pool, [FULL4, WIN8], 64, group_ids=(1, 1))
    with pytest.raises(ValueError, match="distinct, one per group"):
        KVCacheCoordinator(pool, [FULL4, WIN8], 64, group_ids=(1,))
    check_coordinator(co)


def test_check_coordinator_sees_a_block_no_table_holds() -> None:
    co = coordinator(8, FULL4, WIN8)
    prefill(co, request("a", list(range(8))))
    co.groups[1].tables["a"].pop()  # block 4 still held, by no table
    with pytest.raises(InvariantError, match="block 4 has ref_cnt 1 but 0 table slot"):
        check_coordinator(co)
    co.groups[0].tables["a"][0] = co.pool.null_block
    with pytest.raises(InvariantError, match="full-attention group 0 holds the null block"):
        check_coordinator(co)


def test_bad_allocations_are_refused_before_anything_changes(snapshot: Snap) -> None:
    co = coordinator(12, FULL4, WIN8)
    a = request("a", TOKENS)
    prefill(co, a)
    co.free("a")
    b = request("b", [*TOKENS, 99])
    hit, n = co.find_longest_cache_hit(b.block_hashes, 20)
    assert (ids(hit), n) == ([[1, 2, 3, 4, 5], [0, 0, 0, 9, 10]], 20)
    before = snapshot(co.pool)
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0, got 0"):
        co.allocate_slots(b, 0, n, hit, num_computed_tokens=0, num_tokens=21)
    with pytest.raises(ValueError, match="1 lists of hit blocks for 2 groups"):
        co.allocate_slots(b, 1, n, hit[:1], num_computed_tokens=0, num_tokens=21)
    assert snapshot(co.pool) == before
    assert co.allocate_slots(b, 1, n, hit, num_computed_tokens=0, num_tokens=21) is not None
    held = snapshot(co.pool)
    # a running request (blocks held) takes no new hits, and nothing moves --
    # not even the blocks that left its window
    with pytest.raises(ValueError, match="request b already holds blocks"):
        co.allocate_slots(b, 1, 4, hit, num_computed_tokens=21, num_tokens=22)
    assert snapshot(co.pool) == held
    # the queue was 11, 5-1 (group 0, reversed), 10-6: new blocks 11 and 8
    assert co.block_ids("b") == [[1, 2, 3, 4, 5, 11], [0, 0, 0, 9, 10, 8]]
    check_coordinator(co)


def test_eagle_with_a_window_below_the_alignment_is_refused() -> None:
    pool = BlockPool(8, True, 4)
    with pytest.raises(ValueError, match="eagle needs every sliding-window group"):
        KVCacheCoordinator(
            pool, [GroupSpec(FULL_ATTENTION, 8), WIN8], 64, hash_block_size=4, use_eagle=True
        )
    # full attention may be coarser than the hash blocks with eagle
    KVCacheCoordinator(pool, [GroupSpec(FULL_ATTENTION, 8), FULL4], 64, use_eagle=True)
    check_invariants(pool)
