"""RequestManager: a request's life above the pool (docs/spec.md section 8)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from blockpool import (
    Admission,
    BlockPool,
    BlockRemoved,
    BlockStored,
    DuplicateRequestError,
    NotEnoughBlocksError,
    PrefixCacheStats,
    RequestFinishedError,
    RequestManager,
    UnknownRequestError,
    check_invariants,
    get_none_hash,
    hash_block_tokens,
    make_block_hash_with_group_id,
    sha256,
)
from blockpool.core.invariants import check_coordinator

Snap = Callable[[BlockPool], dict[str, Any]]
QIds = Callable[[BlockPool], list[int]]
Mapped = Callable[[BlockPool], dict[bytes, tuple[str, list[int]]]]

A = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 + 1


def setup(n: int = 12, bs: int = 4, **kw: Any) -> tuple[BlockPool, RequestManager]:
    pool = BlockPool(n, True, bs, enable_kv_cache_events=True)
    return pool, RequestManager(pool, **kw)


def as_int(h: bytes) -> int:
    return int.from_bytes(h[-8:], "big")


def mstate(m: RequestManager) -> Any:
    return (
        {k: (r.block_ids(), r.num_tokens, r.num_cached_blocks) for k, r in m.requests.items()},
        (m.stats.requests, m.stats.queries, m.stats.hits),
    )


def test_admit_allocates_caches_and_counts_stats(qids: QIds) -> None:
    pool, m = setup()
    adm = m.admit("a", A)
    assert adm == Admission("a", [[1, 2, 3, 4]], 0, 0, 4)
    hs = m.block_hashes_of("a")
    assert len(hs) == 3
    assert pool.take_events() == [
        BlockStored([as_int(h) for h in hs], None, A[:12], 4, None, "GPU", None)
    ]
    assert [pool.blocks[i].block_hash for i in (1, 2, 3, 4)] == [
        make_block_hash_with_group_id(h, 0) for h in hs
    ] + [None]
    assert m.stats == PrefixCacheStats(requests=1, queries=13, hits=0)
    assert qids(pool) == [5, 6, 7, 8, 9, 10, 11]
    check_invariants(pool)


def test_hits_never_include_the_last_prompt_token() -> None:
    pool, m = setup()
    m.admit("a", A)
    # 8 tokens = 2 full cached blocks, but the last token must be computed:
    # only 1 block can hit.
    adm = m.admit("b", A[:8])
    assert (adm.num_hit_blocks, adm.num_computed_tokens) == (1, 4)
    assert adm.block_ids == [[1, 5]]
    # Block 5 holds the same content as block 2 and is cached again: a duplicate.
    assert pool.cached_block_hash_to_block.blocks_under(pool.blocks[2].block_hash) == [  # type: ignore[arg-type]
        pool.blocks[2],
        pool.blocks[5],
    ]
    assert m.lookup(A[:9]) == 8  # 9 tokens: two blocks may hit
    assert m.lookup(A[:8]) == 4
    assert m.lookup(A[:1]) == 0
    assert m.stats.hits == 4 and m.stats.queries == 13 + 8
    check_invariants(pool)


def test_hits_stop_at_the_first_miss(qids: QIds) -> None:
    pool, m = setup()
    m.admit("a", A)
    m.finish("a")
    assert qids(pool) == [5, 6, 7, 8, 9, 10, 11, 4, 3, 2, 1]
    pool.evict_blocks([2])  # the second block's hash goes; the third stays cached
    pool.take_events()
    assert pool.get_cached_block(m._view(m.make_request("q", A))[2], [0]) == [pool.blocks[3]]
    adm = m.admit("b", A)
    assert (adm.num_hit_blocks, adm.block_ids) == (1, [[1, 5, 6, 7]])
    # The third block (block 3) is not touched: it is still free.
    assert pool.blocks[3].ref_cnt == 0 and 3 in qids(pool)
    check_invariants(pool)


def test_lookup_changes_nothing(snapshot: Snap) -> None:
    pool, m = setup()
    m.admit("a", A)
    before, mbefore = snapshot(pool), mstate(m)
    assert m.lookup(A) == 12
    assert m.lookup([1, 2, 3, 4, 5]) == 0
    assert m.lookup(A, lora_name="other") == 0
    assert snapshot(pool) == before and mstate(m) == mbefore
    check_invariants(pool)


def test_decode_allocates_and_caches_as_blocks_fill(qids: QIds) -> None:
    pool, m = setup()
    m.admit("d", A[:6])  # 1 full block, 2 allocated
    h0 = m.block_hashes_of("d")[0]
    pool.take_events()
    assert m.append_tokens("d", [7, 8]) == [[]]  # fills block 2: cached
    h1 = m.block_hashes_of("d")[1]
    assert pool.take_events() == [
        BlockStored([as_int(h1)], as_int(h0), [*A[4:6], 7, 8], 4, None, "GPU", None)
    ]
    assert m.append_tokens("d", [9]) == [[3]]  # a new block, not yet full
    assert pool.take_events() == []
    assert m.append_tokens("d", [10, 11, 12, 13, 14]) == [[4]]  # fills 3, starts 4
    h2 = m.block_hashes_of("d")[2]
    assert pool.take_events() == [
        BlockStored([as_int(h2)], as_int(h1), [9, 10, 11, 12], 4, None, "GPU", None)
    ]
    assert m.append_tokens("d", []) == [[]]
    r = m.get("d")
    assert (r.num_tokens, r.num_cached_blocks, r.block_ids()) == (14, 3, [[1, 2, 3, 4]])
    # A later request hits the decoded blocks too.
    assert m.lookup([*A[:6], 7, 8, 9, 10, 11, 12, 13]) == 12
    assert m.finish("d") == [[4, 3, 2, 1]]
    assert qids(pool)[-4:] == [4, 3, 2, 1]
    check_invariants(pool)


def test_finish_frees_in_reverse_and_shared_prefix_lives_longest(qids: QIds) -> None:
    pool, m = setup()
    m.admit("a", A)  # 1 2 3 4
    m.admit("b", [*A[:8], 7, 7, 7])  # hits 1 2; new 5
    m.admit("c", [1, 2, 3])  # 6
    assert m.finish("a") == [[4, 3, 2, 1]]
    assert qids(pool) == [7, 8, 9, 10, 11, 4, 3]  # 2 and 1 are still held by b
    assert m.finish("c") == [[6]]
    assert m.finish("b") == [[5, 2, 1]]
    assert qids(pool) == [7, 8, 9, 10, 11, 4, 3, 6, 5, 2, 1]
    assert m.requests == {}
    check_invariants(pool)


def test_refusal_changes_nothing(snapshot: Snap) -> None:
    pool, m = setup(n=6)
    m.admit("a", A[:9])  # 3 blocks, 2 free left
    before, mbefore = snapshot(pool), mstate(m)
    with pytest.raises(NotEnoughBlocksError) as info:
        m.admit("big", list(range(9)))
    assert (info.value.requested, info.value.free) == (3, 2)
    assert snapshot(pool) == before and mstate(m) == mbefore
    with pytest.raises(UnknownRequestError):
        m.get("big")
    # Decode that needs more than is free is refused too, tokens and all.
    m.admit("b", [1, 2, 3, 4, 5, 6, 7])  # 2 blocks, 0 free
    before, mbefore = snapshot(pool), mstate(m)
    with pytest.raises(NotEnoughBlocksError):
        m.append_tokens("b", [8, 9])
    assert snapshot(pool) == before and mstate(m) == mbefore
    assert m.get("b").request.all_token_ids == [1, 2, 3, 4, 5, 6, 7]
    m.append_tokens("b", [8])  # fits in the last block
    check_invariants(pool)


def test_hits_that_are_free_count_against_the_free_blocks(snapshot: Snap) -> None:
    pool, m = setup(n=5, bs=2)
    m.admit("x", [1, 2, 3, 4, 5])
    m.finish("x")  # blocks 1 and 2 are cached and free
    before = snapshot(pool)
    # 2 hits (both free) + 3 new = 5 blocks leave the queue, only 4 are free.
    with pytest.raises(NotEnoughBlocksError) as info:
        m.admit("y", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert (info.value.requested, info.value.free) == (5, 4)
    assert snapshot(pool) == before
    adm = m.admit("y", [1, 2, 3, 4, 5, 6, 7])  # 2 hits + 2 new fits
    assert adm.block_ids == [[1, 2, 4, 3]] and adm.num_new_blocks == 2
    check_invariants(pool)


def test_typed_errors_for_ids() -> None:
    pool, m = setup()
    m.admit("a", [1, 2, 3])
    with pytest.raises(DuplicateRequestError):
        m.admit("a", [4, 5, 6])
    with pytest.raises(UnknownRequestError, match="no running request 'zz'"):
        m.finish("zz")
    with pytest.raises(KeyError):  # UnknownRequestError is a KeyError too
        m.append_tokens("zz", [1])
    m.finish("a")
    with pytest.raises(RequestFinishedError):
        m.finish("a")
    with pytest.raises(RequestFinishedError):
        m.append_tokens("a", [1])
    with pytest.raises(ValueError, match="at least one token"):
        m.admit("e", [])
    m.admit("a", [1, 2, 3])  # a finished id may be used again
    assert m.finish("a") == [[2]]
    check_invariants(pool)


def test_constructor_validation() -> None:
    pool = BlockPool(4, True, 4)
    with pytest.raises(ValueError, match="multiple"):
        RequestManager(pool, block_size=6)
    with pytest.raises(ValueError, match="distinct"):
        RequestManager(pool, group_ids=(0, 0))
    with pytest.raises(ValueError, match="distinct and non-empty"):
        RequestManager(pool, group_ids=())
    assert RequestManager(pool).block_size == 4


def test_lora_and_cache_salt_change_hashes() -> None:
    pool, m = setup(n=20)
    toks = A[:8]
    plain = m.make_request("p", toks).block_hashes
    lora = m.make_request("l", toks, lora_name="sql").block_hashes
    salt = m.make_request("s", toks, cache_salt="tenant-1").block_hashes
    none = get_none_hash()
    assert lora[0] == hash_block_tokens(sha256, none, toks[:4], ("sql",))
    assert lora[1] == hash_block_tokens(sha256, lora[0], toks[4:], ("sql",))
    # The salt enters the first block only (and the rest through the chain).
    assert salt[0] == hash_block_tokens(sha256, none, toks[:4], ("tenant-1",))
    assert salt[1] == hash_block_tokens(sha256, salt[0], toks[4:], None)
    assert len({plain[0], lora[0], salt[0]}) == 3
    m.admit("p", [*toks, 0])
    m.admit("l", [*toks, 0], lora_name="sql")
    assert pool.take_events()[1] == BlockStored(
        [as_int(h) for h in lora], None, toks, 4, 1, "GPU", "sql"
    )
    assert m.admit("s", [*toks, 0], cache_salt="tenant-1").num_hit_blocks == 0
    assert m.admit("s2", [*toks, 0], cache_salt="tenant-1").num_hit_blocks == 2
    assert m.admit("s3", [*toks, 0], cache_salt="tenant-2").num_hit_blocks == 0
    assert m.admit("l2", [*toks, 0], lora_name="sql", lora_id=7).num_hit_blocks == 2
    assert m.admit("p2", [*toks, 0]).num_hit_blocks == 2
    m.append_tokens("l2", [1, 2, 3, 4])  # the adapter's id rides on the event
    assert pool.take_events()[-1] == BlockStored(
        [as_int(m.block_hashes_of("l2")[2])], as_int(lora[1]), [0, 1, 2, 3], 4, 7, "GPU", "sql"
    )
    assert m.stats == PrefixCacheStats(requests=7, queries=63, hits=24)
    assert m.stats.hit_rate == 24 / 63
    check_invariants(pool)


def test_multi_group_admission(qids: QIds, mapped: Mapped) -> None:
    pool, m = setup(n=20, group_ids=(0, 1))
    adm = m.admit("a", A[:9])
    assert adm.block_ids == [[1, 2, 3], [4, 5, 6]] and adm.num_new_blocks == 6
    h0, h1 = m.block_hashes_of("a")
    k = make_block_hash_with_group_id
    assert mapped(pool) == {
        k(h0, 0): ("one", [1]),
        k(h1, 0): ("one", [2]),
        k(h0, 1): ("one", [4]),
        k(h1, 1): ("one", [5]),
    }
    adm = m.admit("b", A[:9])
    assert adm.block_ids == [[1, 2, 7], [4, 5, 8]] and adm.num_hit_blocks == 2
    pool.evict_blocks([5])  # group 1 loses the second block: all-or-nothing
    pool.take_events()
    adm = m.admit("c", A[:9])
    assert adm.block_ids == [[1, 9, 10], [4, 11, 12]] and adm.num_hit_blocks == 1
    assert [pool.blocks[i].ref_cnt for i in (1, 2, 4, 5)] == [3, 2, 3, 2]
    assert m.finish("b") == [[7, 2, 1], [8, 5, 4]]
    assert qids(pool)[-2:] == [7, 8]
    check_invariants(pool)


def test_coarse_block_size(mapped: Mapped) -> None:
    pool, m = setup(n=10, bs=2, block_size=4)
    m.admit("a", list(range(9)))  # 4 fine hashes -> 2 coarse blocks
    f = m.make_request("x", list(range(9))).block_hashes
    assert len(f) == 4
    assert mapped(pool) == {
        make_block_hash_with_group_id(f[0] + f[1], 0): ("one", [1]),  # type: ignore[arg-type]
        make_block_hash_with_group_id(f[2] + f[3], 0): ("one", [2]),  # type: ignore[arg-type]
    }
    adm = m.admit("b", list(range(9)))
    assert (adm.block_ids, adm.num_computed_tokens) == ([[1, 2, 4]], 8)
    assert m.block_hashes_of("b") == [f[0] + f[1], f[2] + f[3]]
    m.append_tokens("b", [9, 10, 11])  # 12 tokens: the third coarse block fills
    assert pool.take_events()[-1] == BlockStored(
        [as_int(m.block_hashes_of("b")[2])], as_int(f[3]), [8, 9, 10, 11], 4, None, "GPU", None
    )
    check_invariants(pool)


def test_caching_off_never_hits(mapped: Mapped) -> None:
    pool = BlockPool(8, False, 4, enable_kv_cache_events=True)
    m = RequestManager(pool)
    m.admit("a", A)
    m.finish("a")
    assert m.admit("b", A).num_hit_blocks == 0
    m.append_tokens("b", [1, 2, 3])
    assert mapped(pool) == {} and pool.take_events() == []
    check_invariants(pool)


def test_reuse_evicts_finished_requests_blocks() -> None:
    pool, m = setup(n=6)
    m.admit("a", A[:9])  # 1 2 3; 1 2 cached
    m.finish("a")  # queue 4 5 3 2 1
    pool.take_events()
    m.admit("b", [7] * 16)  # 4 blocks: 4 5 3 2 -> evicts block 2's hash
    h = m.make_request("x", A[:9]).block_hashes
    assert pool.take_events()[0] == BlockRemoved([as_int(h[1])], "GPU")
    assert m.lookup(A[:9]) == 4  # block 1 survives
    check_invariants(pool)


def test_the_blocks_are_the_coordinators(qids: QIds) -> None:
    """The manager keeps no block table of its own: each group's table is its
    coordinator's, cached under the manager's group ids, and the coordinator's
    tables explain every reference the pool counts."""
    pool, m = setup(n=20, group_ids=(3, 7))
    co = m.coordinator
    assert [g.gid for g in co.groups] == [3, 7]
    m.admit("a", A[:9])
    m.admit("b", A[:9])
    assert all(a is b for a, b in zip(co.tables_of("b"), m.get("b").block_tables, strict=True))
    assert co.block_ids("b") == m.get("b").block_ids() == [[1, 2, 7], [4, 5, 8]]
    h0 = m.block_hashes_of("a")[0]
    assert pool.get_cached_block(h0, [3, 7]) == [pool.blocks[1], pool.blocks[4]]
    assert pool.get_cached_block(h0, [0]) is None
    m.append_tokens("b", [1, 2, 3, 4])
    check_coordinator(co)
    tables = [list(t) for t in m.get("a").block_tables]
    managed = m.get("a")
    assert m.finish("a") == [[3, 2, 1], [6, 5, 4]]
    assert managed.block_tables == tables  # still readable after finish
    assert co.block_ids("a") == [[], []]
    assert qids(pool)[-2:] == [3, 6]
    check_coordinator(co)
