"""The mirror applies an engine's operation stream exactly, and knows when it does not."""

from __future__ import annotations

import msgspec
import pytest

from blockpool.mirror import (
    Divergence,
    Gap,
    MirrorApplier,
    decode,
    encode,
    pool_digest,
)
from blockpool.mirror.protocol import OP_ALLOCATE, OP_UNSUPPORTED, Batch, Snapshot
from blockpool.runtime import PoolRuntime
from tests.mirror.workload import FollowedEngine, config


def mirror_of(engine: FollowedEngine) -> tuple[PoolRuntime, MirrorApplier]:
    rt = PoolRuntime(config(engine.rt.pool.num_gpu_blocks, engine.free_order))
    return rt, MirrorApplier(rt)


def wire(b: Batch) -> Batch:
    out = decode(encode(b))
    assert isinstance(out, Batch)
    return out


def assert_same(engine: FollowedEngine, rt: PoolRuntime) -> None:
    assert pool_digest(rt.pool) == pool_digest(engine.rt.pool)
    assert [b.block_id for b in rt.pool.free_block_queue] == [
        b.block_id for b in engine.rt.pool.free_block_queue
    ]
    assert [b.block_hash for b in rt.pool.blocks] == [b.block_hash for b in engine.rt.pool.blocks]
    rt.check()


@pytest.mark.parametrize("free_order", ["append_all", "uncached_first"])
def test_the_stream_rebuilds_the_pool_block_for_block(free_order: str) -> None:
    engine = FollowedEngine(free_order=free_order)
    rt, applier = mirror_of(engine)
    applier.synced = True
    checked = 0
    for _ in range(30):
        engine.drive(10)
        for b in engine.batches:
            # as the service does: one writer, each batch a unit whose events are absorbed
            checked += rt.run(lambda b=b: applier.apply_batch(wire(b))).digest_checked
        engine.batches.clear()
        assert_same(engine, rt)
    assert checked >= 50  # every third batch carries a digest, and each agreed
    assert applier.next_op == engine.follower.op_count
    # the columns the dashboard draws agree with the pool: the LRU head is the next victim
    assert rt.columns.queue_order().tolist()[:5] == [
        b.block_id for b in list(engine.rt.pool.free_block_queue)[:5]
    ]
    stats = engine.rt.manager.stats
    assert (rt.manager.stats.queries, rt.manager.stats.hits) == (stats.queries, stats.hits)
    assert stats.hits > 0
    # the same KV events: as many blocks stored and removed, the same prefix tree
    assert rt.counters.blocks_cached == engine.rt.counters.blocks_cached > 0
    assert rt.counters.events == engine.rt.counters.events
    assert rt.counters.evictions == engine.rt.counters.evictions > 0
    assert (rt.tree.parents, rt.tree.copies) == (engine.rt.tree.parents, engine.rt.tree.copies)


def test_no_token_ids_travel() -> None:
    engine = FollowedEngine()
    engine.drive(40)
    for b in engine.batches:
        for op in b.ops:
            assert all(not (isinstance(x, list) and x and isinstance(x[0], int) and x[0] >= 64)
                       for x in op[1:]), op  # fmt: skip
    # every hash is a digest, not tokens: the prompts' tokens are nowhere in the stream
    blob = b"".join(encode(b) for b in engine.batches)
    tokens = engine.prefixes[0]
    assert msgspec.msgpack.encode(tokens) not in blob


def test_a_wrong_block_id_is_a_divergence() -> None:
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    applier.synced = True
    engine.drive(5)
    batches = [wire(b) for b in engine.batches]
    for b in batches:
        for op in b.ops:
            if op[0] == OP_ALLOCATE:
                op[1][0] = 63 if op[1][0] != 63 else 62
                break
        else:
            applier.apply_batch(b)
            continue
        with pytest.raises(Divergence, match="allocated"):
            applier.apply_batch(b)
        break
    else:
        pytest.fail("no allocation in the stream")
    rt.check()


def test_a_digest_that_differs_is_a_divergence() -> None:
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    applier.synced = True
    engine.drive(6)
    for b in engine.batches:
        b = wire(b)
        if b.digest is not None:
            b.digest = msgspec.structs.replace(b.digest, value="0" * 32)
            with pytest.raises(Divergence, match="digest"):
                applier.apply_batch(b)
            break
        applier.apply_batch(b)
    else:
        pytest.fail("no digest in the stream")
    rt.check()


def test_a_dropped_batch_is_a_gap_and_a_snapshot_heals_it() -> None:
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    applier.synced = True
    engine.drive(8)
    engine.accept = False  # the sender's queue is full: the batch is dropped
    while not engine.follower.drops:
        engine.step()
    engine.accept = True
    engine.drive(4)
    with pytest.raises(Gap):
        for b in engine.batches:
            applier.apply_batch(wire(b))
    assert engine.batches[-1].drops == engine.follower.drops >= 1
    # a snapshot taken now (ops recorded, maybe not flushed) and the later batches
    snap = engine.follower.capture()
    assert snap is not None
    snap = decode(encode(snap))
    assert isinstance(snap, Snapshot)
    applier.restore(snap)
    assert_same(engine, rt)
    engine.batches.clear()
    engine.drive(20)
    for b in engine.batches:
        applier.apply_batch(wire(b))
    assert_same(engine, rt)


def test_a_snapshot_mid_run_then_the_stream_from_there() -> None:
    engine = FollowedEngine(free_order="uncached_first")
    engine.drive(25)
    snap = engine.follower.capture()
    assert snap is not None
    engine.drive(15)
    rt, applier = mirror_of(engine)
    applier.restore(snap)
    for b in engine.batches:  # the older batches are skipped, the newer applied
        applier.apply_batch(wire(b))
    assert_same(engine, rt)


def test_something_the_mirror_cannot_follow_is_said() -> None:
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    applier.synced = True
    engine.follower._unsupported("BlockPool.cache_partial_block")
    b = engine.follower.flush()
    assert b is not None and b.ops[-1] == [OP_UNSUPPORTED, "BlockPool.cache_partial_block"]
    with pytest.raises(Divergence, match="not mirrored"):
        applier.apply_batch(wire(b))
    assert "BlockPool.cache_partial_block" in engine.follower.problems
    rt.check()


def test_garbage_is_refused_by_the_decoder() -> None:
    from blockpool.mirror import ProtocolError

    for bad in (b"", b"\x00\x01", msgspec.msgpack.encode({"type": "batch", "seq": "x"})):
        with pytest.raises(ProtocolError):
            decode(bad)
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    applier.synced = True
    bogus = Batch(seq=1, step=1, ts=0.0, first_op=0, ops=[["a", "nope"]], requests=[],
                  stats=(0, 0, 0), drops=0)  # fmt: skip
    with pytest.raises(Divergence):
        applier.apply_batch(bogus)
    rt.check()
