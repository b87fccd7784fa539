"""The mirror applies an engine's operation stream exactly, and knows when it does not."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from blockpool.analysis.core import Analysis
from blockpool.mirror import (
    Divergence,
    Gap,
    MirrorApplier,
    decode,
    encode,
    pool_digest,
)
from blockpool.mirror.poolview import parts_of
from blockpool.mirror.protocol import Allocate, Batch, Snapshot, Unsupported
from blockpool.runtime import PoolRuntime
from blockpool.runtime.ops import AllocateOp, CacheOp, EvictOp, FreeOp
from tests.mirror.workload import BLOCK, FollowedEngine, config


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
        for op in b.ops:  # every id is a block id of the 64-block pool
            assert all(0 <= i < 64 for i in getattr(op, "ids", ())), op
    # every hash is a digest, not tokens: the prompts' tokens are nowhere in the stream
    blob = b"".join(encode(b) for b in engine.batches)
    tokens = engine.prefixes[0]
    assert msgspec.msgpack.encode(tokens) not in blob


def first_batch(
    steps: int, pick: Callable[[Batch], bool]
) -> tuple[PoolRuntime, MirrorApplier, Batch]:
    """A mirror following an engine from its start, every batch of ``steps``
    steps applied up to the first one ``pick`` chooses (returned unapplied)."""
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    applier.synced = True
    engine.drive(steps)
    for b in map(wire, engine.batches):
        if pick(b):
            return rt, applier, b
        applier.apply_batch(b)
    pytest.fail("no such batch in the stream")


def test_a_wrong_block_id_is_a_divergence() -> None:
    rt, applier, b = first_batch(5, lambda b: any(isinstance(op, Allocate) for op in b.ops))
    op = next(op for op in b.ops if isinstance(op, Allocate))
    op.ids[0] = 63 if op.ids[0] != 63 else 62
    with pytest.raises(Divergence, match="allocated"):
        applier.apply_batch(b)
    rt.check()


def test_a_digest_that_differs_is_a_divergence() -> None:
    rt, applier, b = first_batch(6, lambda b: b.digest is not None)
    assert b.digest is not None
    b.digest = msgspec.structs.replace(b.digest, value="0" * 32)
    with pytest.raises(Divergence, match="digest"):
        applier.apply_batch(b)
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

    def apply_all() -> None:
        for b in engine.batches:
            applier.apply_batch(wire(b))

    with pytest.raises(Gap):
        apply_all()
    assert engine.batches[-1].drops == engine.follower.drops >= 1
    # a snapshot taken now (ops recorded, maybe not flushed) and the later batches
    snap = engine.follower.capture_now()
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
    snap = engine.follower.capture_now()
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
    engine.follower.unsupported("BlockPool.cache_partial_block")
    b = engine.follower.flush()
    assert b is not None and b.ops[-1] == Unsupported("BlockPool.cache_partial_block")
    with pytest.raises(Divergence, match="not mirrored"):
        applier.apply_batch(wire(b))
    assert "BlockPool.cache_partial_block" in engine.follower.problems
    rt.check()


def test_garbage_is_refused_by_the_decoder() -> None:
    from blockpool.mirror import ProtocolError

    for bad in (b"", b"\x00\x01", msgspec.msgpack.encode({"type": "batch", "seq": "x"})):
        with pytest.raises(ProtocolError):
            decode(bad)
    good = msgspec.to_builtins(
        Batch(seq=1, step=1, ts=0.0, first_op=0, ops=[Allocate([1])], requests=[],
              stats=(0, 0, 0), drops=0)
    )  # fmt: skip
    assert isinstance(decode(msgspec.msgpack.encode(good)), Batch)
    for ops in ([["a", "nope"]], [["a", [-1]]], [["z", [1]]], [["c", 0, None, [1], [b"x" * 65]]]):
        with pytest.raises(ProtocolError):
            decode(msgspec.msgpack.encode({**good, "ops": ops}))


def _tree(rt: PoolRuntime) -> tuple[dict[object, object], dict[object, int]]:
    return dict(rt.tree.parents), dict(rt.tree.copies)


def test_a_resync_rebuilds_the_prefix_tree_from_the_restored_pool() -> None:
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    applier.synced = True
    engine.drive(30)
    for b in engine.batches:
        rt.run(lambda b=b: applier.apply_batch(wire(b)))
    engine.batches.clear()
    engine.accept = False  # a gap: what the engine cached now is not heard of
    engine.drive(6)
    engine.accept = True
    snap = engine.follower.capture_now()
    assert snap is not None
    rt.run(lambda: applier.restore(decode(encode(snap))))  # type: ignore[arg-type]
    assert_same(engine, rt)
    # every cached hash is in the tree with its copies; those whose parent the
    # stream told are under it, as in the engine's own tree (from its events)
    want_parents, want_copies = _tree(engine.rt)
    got_parents, got_copies = _tree(rt)
    assert got_copies == want_copies and len(got_copies) > 5
    orphans = rt.tree.orphans
    assert orphans <= set(got_parents)
    for h, p in got_parents.items():
        if h in orphans:
            assert p is None
        else:
            assert p == want_parents[h], h
    assert len(orphans) < len(got_parents)  # most parents were heard of before the gap
    # the stream goes on: new stores give their hashes a parent, removals take them out
    engine.drive(40)
    for b in engine.batches:
        rt.run(lambda b=b: applier.apply_batch(wire(b)))
    assert_same(engine, rt)
    got_parents, got_copies = _tree(rt)
    want_parents, want_copies = _tree(engine.rt)
    assert got_copies == want_copies
    assert rt.tree.orphans <= set(got_parents)
    assert {h: p for h, p in got_parents.items() if h not in rt.tree.orphans} == {
        h: p for h, p in want_parents.items() if h not in rt.tree.orphans
    }


def test_a_mirror_started_mid_run_says_its_tree_is_partial() -> None:
    engine = FollowedEngine()
    engine.drive(25)
    snap = engine.follower.capture_now()
    assert snap is not None
    rt, applier = mirror_of(engine)
    rt.run(lambda: applier.restore(snap))
    cached = {k for k in parts_of(snap)[3] if k is not None}
    assert cached and len(rt.tree.orphans) == len(rt.tree.parents) == len(cached)
    assert all(p is None for p in rt.tree.parents.values())
    rt.check()


def test_a_resync_resets_the_analysis_per_block_state() -> None:
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    an = Analysis(rt, miss_index_size=4096, miss_finished_kept=16)
    rt.observe(an)
    applier.synced = True
    engine.drive(30)
    for b in engine.batches:
        rt.run(lambda b=b: applier.apply_batch(wire(b)))
    engine.batches.clear()
    ring = an.misses.ring

    def cache_tokens(tokens: list[int]) -> int:
        got = engine.rt.apply(AllocateOp(num_blocks=1))["block_ids"]
        engine.rt.apply(CacheOp(block_ids=got, token_ids=tokens))
        return int(got[0])

    tokens = list(range(5000, 5000 + BLOCK))
    bid = cache_tokens(tokens)
    engine.rt.apply(FreeOp(block_ids=[bid]))
    engine.rt.apply(EvictOp(block_ids=[bid]))
    engine.follower.flush()
    for b in engine.batches:
        rt.run(lambda b=b: applier.apply_batch(wire(b)))
    engine.batches.clear()
    (h,) = [h for h in ring.evicted if ring.eviction(h) == ring.ev_serial - 1]
    # during a gap the engine caches that hash again (the mirror does not hear it)
    engine.accept = False
    held = cache_tokens(tokens)
    engine.follower.flush()
    engine.drive(3)
    back = {h}
    engine.accept = True
    snap = engine.follower.capture_now()
    assert snap is not None
    batches_before = an.misses.batches.fb_len
    rt.run(lambda: applier.restore(snap))
    assert_same(engine, rt)
    # an eviction of a hash cached again (unseen) is forgotten: no regret of it later
    assert all(ring.eviction(h) == -1 for h in back)
    # the restored queue is one free batch: its stamps are the columns' now
    fb = an.misses.batches
    assert fb.fb_len == batches_before + 1
    order = rt.columns.queue_order().tolist()
    assert fb.fb_count[fb.fb_len - 1] == len(order) == rt.pool.get_num_free_blocks()
    assert fb.fb_first[fb.fb_len - 1] == int(rt.columns.stamp[order[0]])
    engine.batches.clear()
    engine.rt.apply(FreeOp(block_ids=[held]))
    engine.drive(10)
    for b in engine.batches:
        rt.run(lambda b=b: applier.apply_batch(wire(b)))
    an.on_tick()
    assert_same(engine, rt)
