"""The digest's reading of a hash many blocks share (blockpool/mirror/digest.py):
a prefix that many requests computed at once is cached as many blocks under
one hash.  A change to one of them changes the row of the block that followed
it there, at most -- the others are not read again."""

from __future__ import annotations

import random

import pytest

from blockpool.mirror.digest import STAGED, PoolDigest, pool_digest
from blockpool.runtime import ops
from blockpool.runtime.errors import OperationError
from tests.mirror.workload import BLOCK, FollowedEngine


def copies(engine: FollowedEngine, n: int, tokens: list[int]) -> list[int]:
    """``n`` blocks cached under the hash of ``tokens``, in this order."""
    got = list(engine.rt.apply(ops.AllocateOp(num_blocks=n))["block_ids"])
    for bid in got:
        engine.rt.apply(ops.CacheOp(block_ids=[bid], token_ids=tokens))
    return got


def rows_read(digest: PoolDigest, named: list[int]) -> int:
    """Blocks a reading of ``named`` read (taken, as the reader does)."""
    staged = digest.stage(named)
    digest.commit(staged)
    return len(staged.rows) // STAGED


def test_a_block_among_forty_under_one_hash_is_read_with_its_neighbours_only() -> None:
    engine = FollowedEngine(num_blocks=256)
    pool = engine.rt.pool
    shared = copies(engine, 40, [7] * BLOCK)
    digest = PoolDigest(pool)
    key = pool.blocks[shared[0]].block_hash
    assert key is not None and len(pool.cached_block_hash_to_block._cache[key]) == 40

    # freed: in the queue at its tail (its hash kept): it and the old tail
    engine.rt.apply(ops.FreeOp(block_ids=[shared[20]]))
    assert rows_read(digest, [shared[20]]) <= 3  # (was: every block under the hash, 41)
    assert digest.value == pool_digest(pool)

    # evicted: it leaves the hash; the block that followed it there now
    # follows the one before it -- read; the 38 others are not
    engine.rt.apply(ops.EvictOp(block_ids=[shared[20]]))
    assert pool.blocks[shared[20]].block_hash is None
    assert rows_read(digest, [shared[20]]) <= 3
    assert digest.value == pool_digest(pool)

    # the last one freed and evicted: no block followed it
    engine.rt.apply(ops.FreeOp(block_ids=[shared[-1]]))
    engine.rt.apply(ops.EvictOp(block_ids=[shared[-1]]))
    assert rows_read(digest, [shared[-1]]) <= 3
    assert digest.value == pool_digest(pool)

    # the first one: the second is first now
    engine.rt.apply(ops.FreeOp(block_ids=[shared[0]]))
    engine.rt.apply(ops.EvictOp(block_ids=[shared[0]]))
    assert rows_read(digest, [shared[0]]) <= 4
    assert digest.value == pool_digest(pool)
    engine.rt.check()


@pytest.mark.parametrize("seed", range(16))
def test_hashes_many_blocks_share_leave_and_join_and_the_digest_stays_the_pools(
    seed: int,
) -> None:
    """Random calls over three hashes shared by many blocks -- cached,
    freed, touched back, evicted, reused by allocation -- read after each
    step by the deferred reader, as the plugin's thread reads them: the
    digest is the pool's every time."""
    rng = random.Random(seed)
    engine = FollowedEngine(num_blocks=96, defer_digest=True)
    f = engine.follower
    rt = engine.rt
    patterns = [[p] * BLOCK for p in (3, 5, 9)]
    held: list[int] = []
    biggest = 0  # blocks under one hash, at most
    for _ in range(300):
        for _ in range(rng.randrange(1, 6)):
            r = rng.random()
            try:
                if r < 0.3 and rt.pool.get_num_free_blocks() > 8:
                    got = rt.apply(ops.AllocateOp(num_blocks=rng.randrange(1, 6)))["block_ids"]
                    tokens = rng.choice(patterns)
                    for bid in got:
                        rt.apply(ops.CacheOp(block_ids=[bid], token_ids=tokens))
                    held += got
                elif r < 0.6 and held:
                    rt.apply(ops.FreeOp(block_ids=[held.pop(rng.randrange(len(held)))]))
                elif r < 0.75:
                    cached = [b.block_id for b in rt.pool.blocks if b.block_hash is not None]
                    if cached:
                        bid = rng.choice(cached)
                        rt.apply(ops.TouchOp(block_ids=[bid]))
                        held.append(bid)
                elif r < 0.9:
                    rt.apply(ops.EvictOp(block_ids=[rng.randrange(1, rt.pool.num_gpu_blocks)]))
                elif held:  # a block freed and taken back: it leaves the queue's middle
                    bid = held.pop(rng.randrange(len(held)))
                    rt.apply(ops.FreeOp(block_ids=[bid]))
                    if rt.pool.blocks[bid].block_hash is not None:
                        rt.apply(ops.TouchOp(block_ids=[bid]))
                        held.append(bid)
            except OperationError:
                pass
        f.flush()
        if f.catch_up():  # an idle engine: the whole backlog read at once
            assert f.reader.verified is not None
            assert f.reader.verified.value == f.digest.value
        assert not f.reader.due  # (nothing due: the step named no block)
        assert f.digest.value == pool_digest(rt.pool)
        entries = rt.pool.cached_block_hash_to_block._cache.values()
        biggest = max([biggest, *(len(e) for e in entries if e.__class__ is dict)])
    assert biggest >= 8  # (the workload did share its hashes widely)
    rt.check()


@pytest.mark.parametrize("seed", range(12))
def test_an_update_written_as_it_reads_equals_a_staged_one_row_for_row(seed: int) -> None:
    """``update`` (the mirror's: each row written as it is read) and
    ``stage`` + ``commit`` (the plugin's reader) of the same named blocks,
    after random calls over hashes many blocks share, an eviction, a reset:
    the same rows, keys and total, and the pool's digest."""
    rng = random.Random(seed)
    engine = FollowedEngine(num_blocks=96)
    rt = engine.rt
    direct, staged = PoolDigest(rt.pool), PoolDigest(rt.pool)
    patterns = [[p] * BLOCK for p in (3, 5, 9)]
    held: list[int] = []
    for step in range(200):
        named: list[int] = []
        for _ in range(rng.randrange(1, 6)):
            r = rng.random()
            try:
                if r < 0.3 and rt.pool.get_num_free_blocks() > 8:
                    got = rt.apply(ops.AllocateOp(num_blocks=rng.randrange(1, 6)))["block_ids"]
                    named += got
                    tokens = rng.choice(patterns)
                    for bid in got:
                        rt.apply(ops.CacheOp(block_ids=[bid], token_ids=tokens))
                    held += got
                elif r < 0.6 and held:
                    bid = held.pop(rng.randrange(len(held)))
                    named.append(bid)
                    rt.apply(ops.FreeOp(block_ids=[bid]))
                elif r < 0.8:
                    cached = [b.block_id for b in rt.pool.blocks if b.block_hash is not None]
                    if cached:
                        bid = rng.choice(cached)
                        named.append(bid)
                        rt.apply(ops.TouchOp(block_ids=[bid]))
                        held.append(bid)
                else:
                    bid = rng.randrange(1, rt.pool.num_gpu_blocks)
                    named.append(bid)
                    rt.apply(ops.EvictOp(block_ids=[bid]))
            except OperationError:
                pass
        if step == 150:  # every hash cleared at once (held blocks keep theirs out of the map)
            for bid in held:
                rt.apply(ops.FreeOp(block_ids=[bid]))
            named += held
            held = []
            rt.apply(ops.ResetOp())
            direct.update(named)
            staged.commit(staged.stage(named))
            direct.after_reset()
            staged.after_reset()
            named = []
        rng.shuffle(named)
        direct.update(named)
        staged.commit(staged.stage(named))
        assert direct.rows == staged.rows
        assert direct.keys == staged.keys
        assert direct.value == staged.value == pool_digest(rt.pool)
    rt.check()
