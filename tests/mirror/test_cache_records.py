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
from blockpool_vllm.call_records import ALLOCATE, CACHE, count_ops, resolve
from tests.mirror.workload import BLOCK, FollowedEngine


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
