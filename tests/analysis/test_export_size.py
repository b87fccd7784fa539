"""The history export's size, estimated from samples (never by writing the
file), stays within a few percent of the file whatever the operation mix
did over time and however rarely ticks came."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

from app.pool.engine import Engine
from app.pool.schemas import AdmitOp, AppendOp, FinishOp, PrefixLookupOp
from app.shared.errors import OperationError
from blockpool import check_invariants
from blockpool.analysis.export import export_lines
from blockpool.analysis.recording import Recorder

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
