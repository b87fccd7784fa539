"""An engine's hashes stay bytes from its wire to the pool, hexed once where
they leave (issue 28, item 7).

The mirror applies an engine's cache operation with the engine's raw hashes
(``EngineCacheOp``): its recording holds them raw, and only a recording's
export hexes them, as the API's ``cache`` operation, which ``blockpool
replay`` replays exactly.  Before, the applier hexed them for ``CacheOp``,
whose handler turned them back into bytes and hexed them again for its
result (and the recording held the hex).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from blockpool.analysis.export import entry_json, export_lines
from blockpool.analysis.moments import diff_json, rebuild
from blockpool.analysis.recording import Recorder
from blockpool.analysis.replay import replay_file
from blockpool.analysis.segment import EventsView, unpack
from blockpool.mirror import Divergence, MirrorApplier
from blockpool.mirror.protocol import Allocate, Batch, Cache
from blockpool.runtime import PoolRuntime
from blockpool.runtime.ops import CacheOp, EngineCacheOp, op_from_json, public_form
from tests.mirror.test_apply import assert_same, mirror_of, wire
from tests.mirror.workload import FollowedEngine


def recorded_mirror(
    steps: int,
) -> tuple[FollowedEngine, PoolRuntime, MirrorApplier, Recorder, list[Batch]]:
    """A mirror with a recording, following an engine's ``steps`` steps; the
    batches it applied (as they came off the wire)."""
    engine = FollowedEngine()
    rt, applier = mirror_of(engine)
    rec = Recorder(rt, max_ops=1_000_000, max_bytes=1 << 30, keyframe_ops=1_000_000)
    rec.describe_engine({"vllm_version": "test", "num_gpu_blocks": 64})  # a mirror's
    rt.recorder = rec
    applier.synced = True
    engine.drive(steps)
    applied = [wire(b) for b in engine.batches]
    for b in applied:
        rt.run(lambda b=b: applier.apply_batch(b))
    engine.batches.clear()
    return engine, rt, applier, rec, applied


def batch(first_op: int, ops: list[Allocate | Cache]) -> Batch:
    return Batch(
        seq=0,
        step=0,
        ts=0.0,
        first_op=first_op,
        ops=list(ops),
        requests=[],
        stats=(0, 0, 0),
        drops=0,
    )


def wire_caches(engine_batches: list[Batch]) -> list[Cache]:
    return [op for b in engine_batches for op in b.ops if isinstance(op, Cache) and op.ids]


def test_the_engines_hashes_reach_the_pool_and_the_recording_as_bytes() -> None:
    engine, rt, _, rec, applied = recorded_mirror(40)
    sent = wire_caches(applied)
    assert len(sent) > 10 and any(op.parent is not None for op in sent)
    assert_same(engine, rt)

    seg = rec.segments[-1]
    recorded = [unpack(e) for e in seg.entries()]
    caches = [(op, ok, res) for _, _, op, ok, res in recorded if op.op == "cache"]
    assert len(caches) == len(sent)
    for (op, ok, result), w in zip(caches, sent, strict=True):
        # the record the pool applied: the wire's bytes, as they came
        assert isinstance(op, EngineCacheOp) and ok
        assert op.block_hashes == w.hashes and all(type(h) is bytes for h in op.block_hashes)
        assert op.parent_block_hash == w.parent and op.block_ids == w.ids
        assert result == {"block_ids": w.ids}  # no hashes hexed for a result nobody reads
    # the recording's bytes hold the raw digests, never their hex
    blobs = b"".join(seg.blobs)
    for w in sent:
        for h in w.hashes:
            assert h in blobs and h.hex().encode() not in blobs
    # every hash the pool's blocks carry is one of the engine's digests (and its group)
    digests = {h for w in sent for h in w.hashes}
    held = [b.block_hash for b in rt.pool.blocks if b.block_hash is not None]
    assert held and all(bytes(h)[:-4] in digests for h in held)
    rt.check()


def test_the_export_hexes_them_once_as_the_apis_cache_and_replays(tmp_path: Path) -> None:
    engine, rt, _, rec, _ = recorded_mirror(60)
    header, segs, final, view = rec.export_parts()
    lines = [json.loads(x) for x in export_lines(header, segs, final, view)]
    cache_lines = [x for x in lines if x["type"] == "op" and x["op"]["op"] == "cache"]
    assert len(cache_lines) > 10
    for x in cache_lines:
        # exactly the API's cache operation and result: hex, as REST takes and answers
        op = op_from_json(x["op"])
        assert isinstance(op, CacheOp) and op.block_hashes is not None
        assert x["op"] == msgspec.to_builtins(op)
        assert x["result"] == {"block_ids": op.block_ids, "block_hashes": op.block_hashes}
        assert all(bytes.fromhex(h) for h in op.block_hashes)
    path = tmp_path / "mirror.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = replay_file(path)
    assert report.ok, report.problems
    assert report.refused == 0 and report.result_mismatches == 0 and report.final_matches
    # the in-memory replay (a moment's state) applies the engine's records as they are
    seg = rec.segments[-1]
    moment = rebuild(seg.keyframe, seg.entries(), rt.config)
    assert moment.mismatches == 0 and moment.replayed == len(seg)
    assert [b.block_hash for b in moment.engine.pool.blocks] == [
        b.block_hash for b in rt.pool.blocks
    ]
    moment.engine.check()
    # a diff of two moments counts them by the API's name
    start = rebuild(seg.keyframe, [], rt.config)
    d = diff_json(start, moment, seg.entries(), EventsView(rt.events), limit=5)
    assert d["ops"]["by_type"]["cache"] == len(cache_lines)
    assert sum(d["ops"]["by_type"].values()) == len(seg)
    assert_same(engine, rt)


def test_an_engines_cache_the_pool_refuses_is_a_divergence_and_changes_nothing() -> None:
    _, rt, applier, rec, _ = recorded_mirror(20)
    before = [(b.block_hash, b.ref_cnt) for b in rt.pool.blocks]
    free = next(b.block_id for b in rt.pool.free_block_queue if b.block_hash is None)
    for ids, hashes, what in (
        ([free], [b"\x01" * 32], "not held"),  # a block nobody holds
        ([free, free], [b"\x01" * 32, b"\x02" * 32], "distinct"),
    ):
        bad = batch(applier.next_op, [Cache(group=0, parent=None, ids=ids, hashes=hashes)])
        with pytest.raises(Divergence, match=what):
            rt.run(lambda bad=bad: applier.apply_batch(wire(bad)))
        assert [(b.block_hash, b.ref_cnt) for b in rt.pool.blocks] == before
    # a held block with one hash too few: refused by the record's handler too
    got = rt.run(lambda: applier.apply_batch(wire(batch(applier.next_op, [Allocate(ids=[free])]))))
    assert got.ops == 1
    with pytest.raises(Exception, match="1 block\\(s\\) need 1 hashes, got 0"):
        rt.apply(EngineCacheOp(block_ids=[free], block_hashes=[]))
    assert rt.pool.blocks[free].block_hash is None
    # a refusal's recorded body is exported as it is, its operation as the API's
    seg = rec.segments[-1]
    refused = [e for e in seg.entries() if not unpack(e)[3]]
    assert refused
    x = entry_json(refused[-1], EventsView(rt.events))
    assert x["op"]["op"] == "cache" and x["op"]["block_hashes"] == []
    assert x["error"]["code"] == "invalid_input"
    op, body = unpack(refused[-1])[2], unpack(refused[-1])[4]
    assert public_form(op, False, body)[1] is body
    rt.check()


def test_the_longest_hash_an_engine_may_send_is_the_longest_the_api_takes() -> None:
    """One bound (``MAX_HASH_BYTES``) for the engine's wire, its record and
    the API's hex: an engine's hash the mirror took is one its export's
    ``cache`` replays through REST; one byte more, refused by all three."""
    from pydantic import ValidationError

    from app.pool.schemas import BODIES
    from blockpool.common.keys import GROUP_ID_BYTES, MAX_HASH_BYTES
    from blockpool.mirror import ProtocolError
    from blockpool.mirror.protocol import Key, decode, encode

    _, rt, applier, rec, _ = recorded_mirror(10)
    free = [b.block_id for b in rt.pool.free_block_queue if b.block_hash is None][:2]
    longest, parent = b"\x07" * MAX_HASH_BYTES, b"\x08" * MAX_HASH_BYTES
    ops = [Allocate(ids=free), Cache(group=3, parent=parent, ids=free[:1], hashes=[longest])]
    rt.run(lambda: applier.apply_batch(wire(batch(applier.next_op, ops))))
    assert bytes(rt.pool.blocks[free[0]].block_hash or b"") == longest + (3).to_bytes(
        GROUP_ID_BYTES, "big"
    )
    x = entry_json(rec.segments[-1].entries()[-1], EventsView(rt.events))
    assert x["op"]["block_hashes"] == [longest.hex()]
    assert x["op"]["parent_block_hash"] == parent.hex()
    assert isinstance(op_from_json(x["op"]), CacheOp)
    BODIES[CacheOp].model_validate(x["op"])  # REST takes it back

    over = b"\x07" * (MAX_HASH_BYTES + 1)
    before = [(b.block_hash, b.ref_cnt) for b in rt.pool.blocks]
    for bad in (
        Cache(group=0, parent=None, ids=free[1:], hashes=[over]),
        Cache(group=0, parent=over, ids=free[1:], hashes=[longest]),
    ):
        with pytest.raises(ProtocolError, match="length"):
            decode(encode(batch(applier.next_op, [bad])))
    with pytest.raises(msgspec.ValidationError, match="length"):
        msgspec.convert({"block_ids": free[1:], "block_hashes": [over]}, EngineCacheOp)
    too_long = {"op": "cache", "block_ids": free[1:], "block_hashes": [over.hex()]}
    with pytest.raises(ValueError, match="operation 'cache'"):
        op_from_json(too_long)
    with pytest.raises(ValidationError, match="pattern"):
        BODIES[CacheOp].model_validate(too_long)
    # a map key (a snapshot's): the hash and its group id, no more
    msgspec.convert(longest + bytes(GROUP_ID_BYTES), Key)
    with pytest.raises(msgspec.ValidationError, match="length"):
        msgspec.convert(over + bytes(GROUP_ID_BYTES), Key)
    assert [(b.block_hash, b.ref_cnt) for b in rt.pool.blocks] == before
    rt.check()
