"""BlockPool(strict=True): the checks vLLM skips, refused before any change."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from blockpool import (
    BlockPool,
    BlockRemoved,
    DoubleFreeError,
    KVCacheBlock,
    KVCacheMetricsCollector,
    NullBlockError,
    PoolAssertionError,
    Request,
    StrictModeError,
    UnknownBlockError,
    check_invariants,
    get_request_block_hasher,
    sha256,
)

Snap = Callable[[BlockPool], dict[str, Any]]
QIds = Callable[[BlockPool], list[int]]


def req(tokens: list[int]) -> Request:
    return Request("r", tokens, block_hasher=get_request_block_hasher(2, sha256))


def strict_pool(n: int = 8) -> tuple[BlockPool, list[KVCacheBlock], Request]:
    """A strict pool with 3 held blocks (2 of them cached) and a cached free one."""
    mc = KVCacheMetricsCollector(1.0, clock=lambda: 5)
    pool = BlockPool(n, True, 2, enable_kv_cache_events=True, metrics_collector=mc, strict=True)
    r = req([1, 2, 3, 4, 5, 6, 7, 8])
    held = pool.get_new_blocks(4)
    pool.cache_full_blocks(r, held, 0, 3, 2, 0)
    pool.free_blocks([held[2]])
    return pool, [held[0], held[1], held[3]], r


def test_errors_are_typed() -> None:
    for err in (UnknownBlockError, NullBlockError, DoubleFreeError):
        assert issubclass(err, StrictModeError) and issubclass(err, ValueError)


def test_double_free_in_separate_calls(snapshot: Snap) -> None:
    pool, held, _ = strict_pool()
    pool.free_blocks([held[2]])
    before = snapshot(pool)
    with pytest.raises(DoubleFreeError, match="block 4 is held 0 time"):
        pool.free_blocks([held[2]])
    assert snapshot(pool) == before
    check_invariants(pool)


def test_double_free_within_one_call_changes_nothing(snapshot: Snap) -> None:
    pool, held, _ = strict_pool()
    before = snapshot(pool)
    with pytest.raises(DoubleFreeError, match="block 2 is held 1 time"):
        pool.free_blocks([held[0], held[1], held[2], held[1]])
    assert snapshot(pool) == before  # block 1 and 2 were not freed either
    check_invariants(pool)


def test_freeing_a_block_held_twice_twice_is_fine(qids: QIds) -> None:
    pool, held, _ = strict_pool()
    pool.touch([held[0]])
    pool.free_blocks([held[0], held[0]])
    assert held[0].ref_cnt == 0 and qids(pool)[-1] == 1
    pool.free_blocks(reversed(held[1:]))
    check_invariants(pool)


@pytest.mark.parametrize("op", ["free", "touch"])
def test_the_null_block_is_refused(op: str, snapshot: Snap) -> None:
    pool, held, _ = strict_pool()
    before = snapshot(pool)
    with pytest.raises(NullBlockError, match="null block"):
        getattr(pool, "free_blocks" if op == "free" else "touch")([held[0], pool.null_block])
    assert snapshot(pool) == before
    check_invariants(pool)


@pytest.mark.parametrize("op", ["free", "touch"])
def test_blocks_of_another_pool_are_refused(op: str, snapshot: Snap) -> None:
    pool, held, _ = strict_pool()
    other = BlockPool(8, True, 2)
    foreign = other.get_new_blocks(2)  # same ids as blocks held here
    assert [b.block_id for b in foreign] == [1, 2]
    before = snapshot(pool)
    method = pool.free_blocks if op == "free" else pool.touch
    with pytest.raises(UnknownBlockError, match="not a block of this pool"):
        method([held[0], foreign[1]])
    with pytest.raises(UnknownBlockError):
        method([KVCacheBlock(99)])
    with pytest.raises(UnknownBlockError):
        method([KVCacheBlock(-1)])
    assert snapshot(pool) == before
    check_invariants(pool)
    check_invariants(other)


def test_touch_of_free_cached_block_still_works(qids: QIds) -> None:
    pool, _, r = strict_pool()
    hit = pool.get_cached_block(r.block_hashes[2], [0])
    assert hit == [pool.blocks[3]]
    assert hit is not None
    pool.touch(hit)
    assert hit[0].ref_cnt == 1 and 3 not in qids(pool)
    check_invariants(pool)


@pytest.mark.parametrize("bad", [8, 100, -1, -8, 1.0, "1", None, True])
def test_evict_blocks_unknown_or_negative_ids(bad: Any, snapshot: Snap) -> None:
    pool, _, _ = strict_pool()
    before = snapshot(pool)
    with pytest.raises(UnknownBlockError, match=r"is not in 0\.\.7"):
        pool.evict_blocks([3, 1, bad])  # the valid ids before it are not evicted
    assert snapshot(pool) == before
    check_invariants(pool)


def test_evict_blocks_accepts_valid_ids_from_any_iterable(qids: QIds) -> None:
    pool, _, r = strict_pool()
    pool.evict_blocks(i for i in (3, 0, 7))  # the null block has no hash: nothing
    assert pool.take_events()[-1] == BlockRemoved(
        [int.from_bytes(r.block_hashes[2][-8:], "big")], "GPU"
    )
    assert pool.blocks[3].block_hash is None and 3 in qids(pool)
    check_invariants(pool)


def test_strict_cache_full_blocks_refuses_before_any_change(snapshot: Snap) -> None:
    pool, held, _ = strict_pool()
    fresh = pool.get_new_blocks(1)
    r2 = req([9, 9, 8, 8, 7, 7])
    table = [fresh[0], held[0]]  # the second already has a hash
    before = snapshot(pool)
    with pytest.raises(PoolAssertionError, match="already has a hash"):
        pool.cache_full_blocks(r2, table, 0, 2, 2, 0)
    assert snapshot(pool) == before and fresh[0].block_hash is None
    foreign = BlockPool(8, True, 2).get_new_blocks(1)
    with pytest.raises(UnknownBlockError):
        pool.cache_full_blocks(r2, [fresh[0], *foreign], 0, 2, 2, 0)
    assert snapshot(pool) == before
    pool.free_blocks(fresh)
    check_invariants(pool)


def test_non_strict_cache_full_blocks_fails_part_way_as_vllm() -> None:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True)
    r = req([1, 2, 3, 4])
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(r, a, 1, 2, 2, 0)  # block 2 gets the second hash
    pool.take_events()
    fresh = pool.get_new_blocks(1)
    with pytest.raises(PoolAssertionError):
        pool.cache_full_blocks(r, [fresh[0], a[1]], 0, 2, 2, 0)
    assert fresh[0].block_hash is not None  # cached before the failure
    assert pool.take_events() == []  # but no BlockStored
    pool.free_blocks(a + fresh)
    check_invariants(pool)


def test_non_strict_accepts_what_strict_refuses() -> None:
    pool = BlockPool(4, True, 2)
    (b,) = pool.get_new_blocks(1)
    pool.touch([pool.null_block])
    pool.free_blocks([pool.null_block, b])
    foreign = BlockPool(4, True, 2).get_new_blocks(1)[0]
    foreign.ref_cnt = 2  # freed here it never reaches 0, so nothing is queued
    pool.free_blocks([foreign])
    assert foreign.ref_cnt == 1
    check_invariants(pool)


def _random_valid_run(strict: bool, seed: int) -> list[Any]:
    """A valid operation sequence; strict mode must not change its outcome."""
    rng = random.Random(seed)
    pool = BlockPool(12, True, 2, enable_kv_cache_events=True, strict=strict)
    held: list[list[KVCacheBlock]] = []
    trace: list[Any] = []
    docs = [[d * 10 + i for i in range(8)] for d in range(3)]
    for _ in range(300):
        op = rng.random()
        if op < 0.35 and pool.get_num_free_blocks() >= 4:
            r = req(docs[rng.randrange(3)][: rng.choice([4, 6, 8])])
            n = len(r.block_hashes)
            hits: list[KVCacheBlock] = []
            for h in r.block_hashes[: n - 1]:
                got = pool.get_cached_block(h, [0])
                if got is None:
                    break
                hits += got
            pool.touch(hits)
            table = hits + pool.get_new_blocks(n - len(hits))
            pool.cache_full_blocks(r, table, len(hits), n, 2, 0)
            held.append(table)
        elif op < 0.7 and held:
            table = held.pop(rng.randrange(len(held)))
            pool.free_blocks(reversed(table) if rng.random() < 0.8 else table)
        elif op < 0.8:
            pool.evict_blocks([rng.randrange(12) for _ in range(2)])
        elif op < 0.85 and not held:
            trace.append(pool.reset_prefix_cache())
        trace.append([b.block_id for b in pool.free_block_queue.get_all_free_blocks()])
        trace.append(pool.take_events())
        check_invariants(pool)
    for table in held:
        pool.free_blocks(table)
    check_invariants(pool)
    return trace


@pytest.mark.parametrize("seed", [1, 2])
def test_strict_mode_does_not_change_valid_behaviour(seed: int) -> None:
    assert _random_valid_run(True, seed) == _random_valid_run(False, seed)
