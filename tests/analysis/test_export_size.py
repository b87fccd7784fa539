"""The history export's size, estimated from samples (never by writing the
file), stays within a few percent of the file whatever the operation mix
did over time and however rarely ticks came."""

from __future__ import annotations

import contextlib
import json
import random
from array import array
from collections.abc import Callable

import pytest

from app.pool.engine import Engine
from app.pool.schemas import (
    AdmitOp,
    AllocateOp,
    AppendOp,
    CacheOp,
    FinishOp,
    PrefixLookupOp,
    TouchOp,
)
from app.shared.errors import OperationError
from blockpool import check_invariants
from blockpool.analysis.export import export_lines
from blockpool.analysis.export_size import _digits, line_bytes
from blockpool.analysis.recording import Recorder
from blockpool.runtime.state import keyframe_json, snapshot

Factory = Callable[..., Engine]


def apply(e: Engine, op: AdmitOp | AppendOp | FinishOp | PrefixLookupOp) -> None:
    with contextlib.suppress(OperationError):  # refused ops are recorded too
        e.apply(op)


def small_ops(e: Engine, rng: random.Random, n: int, tick_every: int) -> None:
    """Short requests, one-token decodes, lookups and touches: few events."""
    for i in range(n):
        rid = f"s{i // 4}"
        kind = i % 4
        if kind == 0:
            apply(e, AdmitOp(request_id=rid, token_ids=[rng.randrange(100) for _ in range(3)]))
        elif kind == 1:
            apply(e, AppendOp(request_id=rid, token_ids=[rng.randrange(100)]))
        elif kind == 2:
            apply(e, PrefixLookupOp(token_ids=[rng.randrange(100) for _ in range(8)]))
        else:
            apply(e, FinishOp(request_id=rid))
        if i % tick_every == tick_every - 1:
            e.tick()


def big_admits(e: Engine, rng: random.Random, n: int, tick_every: int) -> None:
    """Long prompts (dozens of blocks stored) that evict one another: many
    events per operation."""
    for i in range(n):
        rid = f"b{i // 2}"
        if i % 2 == 0:
            toks = [rng.randrange(30_000) for _ in range(rng.randint(100, 240))]
            apply(e, AdmitOp(request_id=rid, token_ids=toks))
        else:
            apply(e, FinishOp(request_id=rid))
        if i % tick_every == tick_every - 1:
            e.tick()


def real_bytes(rec: Recorder) -> int:
    return sum(len(line.encode()) for line in export_lines(*rec.export_parts()))


def assert_close(rec: Recorder) -> None:
    est = rec.export_size()
    real = real_bytes(rec)
    assert abs(est.bytes - real) <= 0.05 * real, (est, real, (est.bytes - real) / real)


def test_the_estimate_follows_a_changing_mix_with_rare_ticks(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=128, recording_keyframe_ops=150, recording_max_ops=700)
    rec = e.analysis.recorder  # type: ignore[union-attr]
    assert rec is not None
    rng = random.Random(3)
    small_ops(e, rng, 800, tick_every=200)
    assert_close(rec)
    # the mix turns: big admits, and the oldest small ops leave the recording
    big_admits(e, rng, 300, tick_every=150)
    assert rec.dropped_segments > 0 and rec.engine.events.dropped == 0
    assert_close(rec)
    # and back: small ops after big ones, never a tick
    small_ops(e, rng, 300, tick_every=10**6)
    assert_close(rec)
    # asked again with nothing new: nothing more is sampled
    samples = [seg.sample.copy() for seg in rec.segments]
    again = rec.export_size()
    assert [seg.sample for seg in rec.segments] == samples
    assert again.lines == sum(1 for _ in export_lines(*rec.export_parts()))
    check_invariants(e.runtime.pool)


def test_events_the_log_no_longer_holds_are_left_out(engine_factory: Factory) -> None:
    """An operation whose events the bounded event log dropped is written
    with ``"events": null``: the estimate leaves their bytes out."""
    e = engine_factory(num_blocks=128, recording_keyframe_ops=100, event_log_capacity=400)
    rec = e.analysis.recorder  # type: ignore[union-attr]
    assert rec is not None
    rng = random.Random(5)
    big_admits(e, rng, 100, tick_every=7)
    assert e.runtime.events.dropped > 0
    first = rec.engine.events.first_seq
    assert any(seg.ev_first[0] < first for seg in rec.segments if len(seg))
    assert_close(rec)
    check_invariants(e.runtime.pool)


def test_ints_digits_are_counted_as_written() -> None:
    edges = [0, 1, 9, 10, 99, 100, 12345, -1, -9, -10, -99, 10**18 - 1, 10**18, 2**63 - 1]
    edges += [-(2**63 - 1), -(10**18)]
    for v in edges:
        assert _digits([v]) == len(str(v)), v
    assert _digits(edges) == sum(len(str(v)) for v in edges)
    assert _digits([]) == 0 and _digits(array("q")) == 0


@pytest.mark.parametrize("seed", range(4))
def test_a_keyframes_line_is_counted_to_the_byte(engine_factory: Factory, seed: int) -> None:
    """Refs, queue, raw refs, hashes and map entries (one block and several
    under a hash) counted, never written: the line's exact bytes."""
    e = engine_factory(num_blocks=128)
    rng = random.Random(seed)
    big_admits(e, rng, 12, 5)  # cached prompts, evictions
    held = e.apply(AllocateOp(num_blocks=rng.randint(3, 6)))["block_ids"]
    h = bytes(rng.randrange(256) for _ in range(32)).hex()
    for bid in held[:2]:  # the same hash on two blocks: a promoted entry
        e.apply(CacheOp(block_ids=[bid], block_hashes=[h]))
    e.apply(TouchOp(block_ids=held[:1]))  # a raw ref of 2
    kf = snapshot(e.runtime, 10**6 + seed, 1.5)
    assert kf.pool.map_dicts and any(n == 2 for _, n in kf.raw_refs)
    for kind in ("keyframe", "final"):
        line = json.dumps({"type": kind, **keyframe_json(kf)}) + "\n"
        assert line_bytes(kind, kf) == len(line.encode())
    check_invariants(e.pool)
