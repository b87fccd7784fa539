"""What the plugin holds while its engine works, as CPython's garbage
collector counts it: every object it keeps alive counts toward the engine's
next young collection, and each collection walks the engine's young requests
(their token lists: 15-25 ms at GPU scale, measured).  A queued batch holds
no object of its own per pool call (the calls are kept flat), and however far
behind the digest's reader is, its pending parts stay few -- and what is read
in the end is as exact."""

from __future__ import annotations

import gc

import msgspec

from blockpool.mirror import pool_digest
from blockpool.mirror import protocol as wire
from blockpool_vllm.call_records import count_ops, resolve
from blockpool_vllm.digest_reader import MAX_BEHIND
from tests.mirror.workload import FollowedEngine


def made_per_call(batch: wire.Batch, engine: FollowedEngine) -> list[object]:
    """The objects a queued batch's calls hold that the collector tracks,
    other than the pool's own blocks."""
    blocks = {id(b) for b in engine.rt.pool.blocks}
    return [o for o in batch.ops if gc.is_tracked(o) and id(o) not in blocks]


def test_a_queued_batch_holds_no_object_of_its_own_per_call() -> None:
    queued: list[wire.Batch] = []
    engine = FollowedEngine(num_blocks=256, defer_digest=True, windowed=True)
    engine.send = lambda b: queued.append(b) is None  # queued, not prepared yet
    engine.drive(60)
    f = engine.follower
    calls = f.op_count
    assert sum(count_ops(b.ops) for b in queued) == calls > 100
    assert [made_per_call(b, engine) for b in queued] == [[]] * len(queued)
    # what they resolve to is what the pool did: the mirror's tests apply it;
    # here, the operation counts and the batches' op ranges chained
    first = 0
    for b in queued:
        assert b.first_op == first
        resolved, _ = resolve(b.ops)
        assert len(resolved) == count_ops(b.ops) == count_ops(resolved)
        first += len(resolved)
    assert first == calls
    engine.rt.check()


def test_a_reader_far_behind_keeps_few_parts_and_reads_them_exactly() -> None:
    engine = FollowedEngine(num_blocks=512, defer_digest=True, windowed=True)
    f = engine.follower
    engine.drive(120)  # every batch prepared (its blocks pending), none read: no turn came
    reader = f.reader
    assert len(reader.pending) == MAX_BEHIND + 1 and reader.sweep is None
    named = [i for part in reader.pending for i in part]
    assert len(named) == len(set(named))  # a block named again while waiting: once
    assert f.digest.value != pool_digest(engine.rt.pool)
    assert not f.catch_up() and len(named) == sum(map(len, reader.pending))  # busy: no turn
    f.passes.last_flush = 0.0  # the engine idle: read, all of it
    assert f.catch_up() and not reader.pending
    assert reader.digests_taken == 1 and reader.sweeps == 0
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_batch_prepared_for_the_wire_holds_no_list_per_operation() -> None:
    """The sender's thread holds a batch's operations until it encodes the
    batch: encoded one by one they hold no id or hash list for the engine's
    collector to count -- and the message is the same bytes, its blocks the
    same for the digest."""
    queued: list[wire.Batch] = []
    engine = FollowedEngine(num_blocks=256, defer_digest=True, windowed=True)
    engine.send = lambda b: queued.append(b) is None
    engine.drive(60)
    f = engine.follower
    records = [
        wire.Batch(**{k: getattr(b, k) for k in b.__struct_fields__}) for b in queued
    ]  # the same calls, each batch prepared the usual way below
    named: set[int] = set()
    for b, r in zip(queued, records, strict=True):
        r.ops, touched = resolve(list(b.ops))
        named.update(i for i in touched if i > 0)
        assert f.prepare_encoded(b) is b
        assert len(b.ops) == len(r.ops) == count_ops(r.ops) > 0
        assert all(type(op) is msgspec.Raw for op in b.ops)
        assert not any(gc.is_tracked(op) for op in b.ops)
        assert wire.encode(b) == wire.encode(r)
        assert wire.decode(wire.encode(b)) == r
    assert sum(len(r.ops) for r in records) == f.op_count
    assert not f.inflight and f.reader.sweep is None  # every batch's blocks handed over ...
    assert sorted(i for part in f.reader.pending for i in part) == sorted(named) != []
    engine.rt.check()
