"""A cache call as the plugin keeps it on the engine's thread -- the window's
blocks and the request's hash chain, nothing read from the blocks -- and as
the sender's thread reads it: the blocks the pool hashed (the null block
never), each with the hash the pool gave it, the parent the chain's.  The
calls it cannot keep so (a block hashed already) are read at once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from blockpool.core.invariants import check_invariants
from blockpool.mirror import protocol as wire
from blockpool.runtime import PoolRuntime
from blockpool_vllm.call_records import ALLOCATE, CACHE, count_ops, resolve
from blockpool_vllm.follower import PoolFollower
from blockpool_vllm.pool_hooks import CACHE_PARAMS, declared_as
from tests.mirror.workload import BLOCK, FollowedEngine, config


def chain(n: int) -> list[bytes]:
    return [bytes([7, i]) * 16 for i in range(n)]


def hashed_by_pool(block: Any) -> bytes:
    """The hash the pool gave a block, without its group id."""
    assert block.block_hash is not None
    return bytes(block.block_hash)[:-4]


def request_of(n: int) -> SimpleNamespace:
    """A request with ``n`` block hashes (what the pool's call reads of it)."""
    return SimpleNamespace(block_hashes=chain(n), lora_request=None, all_token_ids=list(range(64)))


def test_a_cache_call_is_kept_as_its_window_and_chain_and_read_as_the_pool_hashed() -> None:
    engine = FollowedEngine(num_blocks=64, defer_digest=True)
    pool, f = engine.rt.pool, engine.follower
    got = pool.get_new_blocks(5)
    table = [pool.null_block, *got]  # a table that starts with the null block (a window's)
    request = request_of(6)
    pool.cache_full_blocks(request, table, 0, 3, BLOCK, 0)  # the null block, got[0], got[1]
    pool.cache_full_blocks(request, table, 3, 6, BLOCK, 0)  # got[2..4], a parent
    # kept: no hash read on the engine's thread, the chain's slice instead
    hashes = request.block_hashes
    assert (
        f.ops
        == [
            *(ALLOCATE, 5, *got),
            *(CACHE, 0, 0, 3, 3, *table[0:3], *hashes[0:3]),  # offset, group, window, chain
            *(CACHE, 1, 0, 3, 4, *table[3:6], *hashes[2:6]),  # the chain from the parent on
        ]
    )
    assert count_ops(f.ops) == 3
    f.flush()
    (batch,) = engine.batches
    ids = [b.block_id for b in got]
    hashed = [hashed_by_pool(b) for b in got]  # what the pool gave them
    assert hashed == request.block_hashes[1:6]
    assert batch.ops == [
        wire.Allocate(ids),
        wire.Cache(0, request.block_hashes[0], ids[0:2], hashed[0:2]),
        wire.Cache(0, request.block_hashes[2], ids[2:5], hashed[2:5]),
    ]
    assert batch.first_op == 0 and f.op_count == 3
    check_invariants(pool)  # (the pool called directly: the runtime's own view is not)


def test_a_window_of_the_null_block_only_is_an_operation_that_changes_nothing() -> None:
    engine = FollowedEngine(num_blocks=64, defer_digest=True)
    pool, f = engine.rt.pool, engine.follower
    request = request_of(1)
    pool.cache_full_blocks(request, [pool.null_block], 0, 1, BLOCK, 0)
    ops, touched = resolve(f.ops)
    assert ops == [wire.Cache(0, None, [], [])] and touched == []
    assert count_ops(f.ops) == 1 == f.op_count  # one call, one operation (the batch's range)
    check_invariants(pool)  # (the pool called directly: the runtime's own view is not)


def test_a_group_of_another_block_size_is_read_at_once() -> None:
    engine = FollowedEngine(num_blocks=64, defer_digest=True)
    pool, f = engine.rt.pool, engine.follower
    got = pool.get_new_blocks(2)
    request = request_of(4)  # two hash blocks a block
    pool.cache_full_blocks(request, got, 0, 2, 2 * BLOCK, 0)
    hashed = [hashed_by_pool(b) for b in got]
    assert hashed[0] not in request.block_hashes  # a hash of two of the chain's
    # not kept as a usual call: read at once, a typed operation
    assert f.ops[0:4] == [0, 2, *got]
    assert f.ops[4:] == [wire.Cache(0, None, [b.block_id for b in got], hashed)]
    assert count_ops(f.ops) == f.op_count == 2
    assert resolve(f.ops)[0][1] == f.ops[4]
    check_invariants(pool)  # (the pool called directly: the runtime's own view is not)


def followed_with(cache_full_blocks: Any) -> tuple[Any, PoolFollower]:
    """blockpool's pool whose cache_full_blocks is ``cache_full_blocks`` (as
    another vLLM declares it), followed."""
    rt = PoolRuntime(config(64))
    pool = rt.pool
    pool.cache_full_blocks = cache_full_blocks(pool.cache_full_blocks)
    return pool, PoolFollower(pool, lambda _batch: True, defer_digest=True)


def test_vllms_mask_by_keyword_none_is_the_usual_call_and_a_mask_is_handed_on() -> None:
    seen: list[Any] = []

    def declared(plain: Any) -> Any:  # as vLLM >= 0.2x declares it
        def cache_full_blocks(
            request: Any,
            blocks: Any,
            num_cached_blocks: int,
            num_full_blocks: int,
            block_size: int,
            kv_cache_group_id: int,
            block_mask: list[bool] | None = None,
        ) -> None:
            seen.append(block_mask)  # (a mask of all True: the same as none)
            window = (num_cached_blocks, num_full_blocks)
            plain(request, blocks, *window, block_size, kv_cache_group_id)

        return cache_full_blocks

    pool, f = followed_with(declared)
    got = pool.get_new_blocks(4)
    request = request_of(4)
    call = {"request": request, "blocks": got, "block_size": BLOCK, "kv_cache_group_id": 0}
    # as vLLM 0.32 calls it: every argument by keyword, no mask
    pool.cache_full_blocks(**call, num_cached_blocks=0, num_full_blocks=2, block_mask=None)
    assert seen == [None]
    hashes = request.block_hashes
    assert f.ops[6:] == [CACHE, 0, 0, 2, 2, *got[0:2], *hashes[0:2]]  # kept as the usual call
    pool.cache_full_blocks(**call, num_cached_blocks=2, num_full_blocks=4, block_mask=[True, True])
    assert seen == [None, [True, True]]  # the mask reached the pool
    ids, hashed = [b.block_id for b in got], [hashed_by_pool(b) for b in got]
    assert f.ops[-1] == wire.Cache(0, hashes[1], ids[2:4], hashed[2:4])  # read at once
    assert resolve(f.ops)[0] == [
        wire.Allocate(ids),
        wire.Cache(0, None, ids[0:2], hashed[0:2]),
        wire.Cache(0, hashes[1], ids[2:4], hashed[2:4]),
    ]
    assert count_ops(f.ops) == f.op_count == 3 and f.epoch % 2 == 0
    check_invariants(pool)  # (the pool called directly: the runtime's own view is not)


def test_a_cache_call_declared_otherwise_passes_every_argument_through() -> None:
    seen: list[Any] = []

    def declared(plain: Any) -> Any:  # a later vLLM's: one more parameter
        def cache_full_blocks(
            request: Any,
            blocks: Any,
            num_cached_blocks: int,
            num_full_blocks: int,
            block_size: int,
            kv_cache_group_id: int,
            block_mask: list[bool] | None = None,
            retention: int | None = None,
        ) -> None:
            seen.append((block_mask, retention))
            window = (num_cached_blocks, num_full_blocks)
            plain(request, blocks, *window, block_size, kv_cache_group_id)

        return cache_full_blocks

    pool, f = followed_with(declared)
    assert not declared_as(pool.cache_full_blocks, CACHE_PARAMS)  # the generic wrapper
    got = pool.get_new_blocks(2)
    request = request_of(2)
    pool.cache_full_blocks(request, got, 0, 2, BLOCK, 0, retention=3)
    assert seen == [(None, 3)]
    ids, hashed = [b.block_id for b in got], [hashed_by_pool(b) for b in got]
    assert f.ops[4:] == [wire.Cache(0, None, ids, hashed)]  # not the usual call: read at once
    assert count_ops(f.ops) == f.op_count == 2 and f.epoch % 2 == 0
    check_invariants(pool)  # (the pool called directly: the runtime's own view is not)
