"""Time travel: the recording's keyframes + operations rebuild the pool at any
recorded moment exactly (block ids, ref counts, hashes, queue order, map,
requests, counters, sampled blocks), and an exported recording replays into
a fresh engine with the same results and events."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.cli import main as cli_main
from app.pool.engine import Engine
from app.pool.schemas import (
    AdmitOp,
    AllocateOp,
    AppendOp,
    CacheOp,
    EvictOp,
    FinishOp,
    FreeOp,
    LookupOp,
    PrefixLookupOp,
    ResetOp,
    TouchOp,
)
from app.shared.errors import OperationError
from blockpool import check_invariants
from blockpool.analysis import moments, replay
from blockpool.analysis.recording import Recorder
from blockpool.analysis.segment import EventsView
from blockpool.runtime.state import digest, restore, snapshot

Factory = Callable[..., Engine]


def random_run(e: Engine, seed: int, steps: int, tick_every: int = 0) -> dict[int, Any]:
    """Every kind of operation, refusals included; the digest after each op."""
    rng = random.Random(seed)
    docs = [[rng.randrange(50) for _ in range(rng.randint(3, 30))] for _ in range(5)]
    running: list[str] = []
    raw: list[int] = []
    states: dict[int, Any] = {0: digest(e.runtime)}
    assert e.analysis is not None and e.analysis.recorder is not None
    rec = e.analysis.recorder
    for step in range(steps):
        x = rng.random()
        op: Any
        if x < 0.25:
            extra: dict[str, Any] = rng.choice([{}, {}, {"cache_salt": "s1"}, {"lora_name": "l1"}])
            rid = rng.choice([f"r{step}", None])
            toks = rng.choice(docs) + [rng.randrange(50) for _ in range(rng.randint(0, 6))]
            op = AdmitOp(request_id=rid, token_ids=toks, **extra)
        elif x < 0.45 and running:
            op = AppendOp(request_id=rng.choice(running), token_ids=[rng.randrange(50)] * 3)
        elif x < 0.6 and running:
            op = FinishOp(request_id=running.pop(rng.randrange(len(running))))
        elif x < 0.66:
            op = AllocateOp(num_blocks=rng.randint(0, 4))
        elif x < 0.72 and raw:
            k = rng.randint(1, len(raw))
            op = FreeOp(block_ids=[raw.pop(rng.randrange(len(raw))) for _ in range(k)])
        elif x < 0.75:
            op = TouchOp(block_ids=[rng.randrange(1, e.pool.num_gpu_blocks)])
        elif x < 0.8 and raw:
            op = CacheOp(block_ids=[raw[0]], token_ids=[rng.randrange(50) for _ in range(4)])
        elif x < 0.85:
            op = EvictOp(block_ids=rng.sample(range(e.pool.num_gpu_blocks), 3))
        elif x < 0.88:
            op = ResetOp()
        elif x < 0.92:
            op = PrefixLookupOp(token_ids=rng.choice(docs))
        elif x < 0.95:
            op = LookupOp(block_hash="ab" * 32)
        else:
            op = FinishOp(request_id="nobody")  # refused: unknown request
        try:
            result = e.apply(op)
        except OperationError:
            pass
        else:
            if isinstance(op, AdmitOp):
                running.append(result["request_id"])
            elif isinstance(op, AllocateOp):
                raw.extend(result["block_ids"])
            elif isinstance(op, TouchOp):
                raw.extend(op.block_ids)
        states[rec.seq] = digest(e.runtime)
        if tick_every and step % tick_every == 0:
            e.tick()
    for rid in running:
        e.apply(FinishOp(request_id=rid))
    states[rec.seq] = digest(e.runtime)
    return states


def test_snapshot_restore_round_trip(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=24, recording_keyframe_ops=10**6)
    random_run(e, 1, 150)
    assert replay.snapshot_digest(e.runtime) == digest(e.runtime)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_recorded_moment_is_rebuilt_exactly(engine_factory: Factory, seed: int) -> None:
    e = engine_factory(num_blocks=24, recording_keyframe_ops=17)
    states = random_run(e, seed, 260, tick_every=5)
    rec = e.analysis.recorder  # type: ignore[union-attr]
    assert rec is not None and len(rec.segments) > 5
    for seq in [*sorted(states)[::7], rec.seq]:
        m = moments.state_at(rec, seq, e.config)
        assert m.seq == seq
        assert m.mismatches == 0, f"op results differ replaying up to {seq}"
        assert digest(m.engine) == states[seq], f"state after op {seq}"
        check_invariants(m.engine.pool)
        m.engine.check()


def test_export_replays_with_the_same_results_and_events(
    engine_factory: Factory, tmp_path: Path
) -> None:
    e = engine_factory(num_blocks=24, recording_keyframe_ops=40)
    random_run(e, 5, 300)
    rec = e.analysis.recorder  # type: ignore[union-attr]
    assert rec is not None
    path = tmp_path / "rec.jsonl"
    path.write_text("".join(_lines(*rec.export_parts())))
    report = replay.replay_file(path)
    assert report.ok, report.as_dict()
    assert report.ops == rec.seq and report.keyframes == len(rec.segments)
    assert report.final_matches is True
    assert report.refused > 0  # refusals are replayed as refusals
    _, end = replay.replay_records(replay.read_lines(path))
    assert digest(end) == digest(e.runtime)
    assert cli_main(["replay", str(path)]) == 0
    assert cli_main(["replay", str(path), "--json"]) == 0


def _lines(header: Any, segments: Any, final: Any, view: Any) -> list[str]:
    from blockpool.analysis.export import export_lines

    return list(export_lines(header, segments, final, view))


def test_a_tampered_recording_is_reported(
    engine_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    e = engine_factory(num_blocks=24)
    random_run(e, 3, 80)
    rec = e.analysis.recorder  # type: ignore[union-attr]
    assert rec is not None
    lines = _lines(*rec.export_parts())
    for i, line in enumerate(lines):
        d = json.loads(line)
        if d["type"] == "op" and d["op"]["op"] == "admit" and d["ok"]:
            d["result"]["block_ids"] = [[999]]
            lines[i] = json.dumps(d) + "\n"
            break
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(lines))
    report = replay.replay_file(path)
    assert not report.ok and report.result_mismatches == 1
    assert "admit" in (report.first_problem or "")
    capsys.readouterr()
    assert cli_main(["replay", str(path), "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] is False and printed["result_mismatches"] == 1
    assert printed["first_problem"] == report.first_problem and printed["path"] == str(path)
    (tmp_path / "nothing.jsonl").write_text('{"type": "op"}\n')
    assert cli_main(["replay", str(tmp_path / "nothing.jsonl")]) == 2


def test_the_recording_is_bounded_and_starts_at_a_keyframe(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=24, recording_keyframe_ops=20, recording_max_ops=100)
    states = random_run(e, 9, 400, tick_every=3)
    rec = e.analysis.recorder  # type: ignore[union-attr]
    assert rec is not None
    assert rec.dropped_ops > 0 and rec.first_seq > 0 and rec.ops <= 100 + 2 * 20
    with pytest.raises(LookupError):
        moments.state_at(rec, rec.first_seq - 1, e.config)
    m = moments.state_at(rec, rec.first_seq, e.config)
    assert digest(m.engine) == states[rec.first_seq]
    lines = _lines(*rec.export_parts())
    report, end = replay.replay_records(json.loads(x) for x in lines)
    assert report.ok and digest(end) == digest(e.runtime)


def test_moments_by_time_and_seq(engine_factory: Factory, clock: Any) -> None:
    e = engine_factory(num_blocks=24)
    rec: Recorder = e.analysis.recorder  # type: ignore[union-attr,assignment]
    t0 = clock.t
    for i in range(5):
        clock.advance(60)
        e.apply(AdmitOp(request_id=f"m{i}", token_ids=[i] * 6))
    assert moments.parse_moment(rec, "3") == 3
    assert moments.parse_moment(rec, str(t0 + 130)) == 2  # the op at t0+120 is the last by then
    assert moments.parse_moment(rec, str(t0 + 10)) == 0  # before any op: the first keyframe
    iso = __import__("datetime").datetime.fromtimestamp(t0 + 300.0).isoformat()
    assert moments.parse_moment(rec, iso) == 5
    for bad, why in (
        ("yesterday", "'yesterday' is not an op seq, a Unix time or an ISO 8601 time"),
        ("-3", "'-3' is not a moment"),
        ("2.5", "'2.5': an op seq is a whole number"),
        ("nan", "'nan' is not a moment"),
    ):
        with pytest.raises(ValueError, match=why):
            moments.parse_moment(rec, bad)
    assert rec.ts_of(2) == t0 + 120


def test_diff_between_two_moments(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=8)
    e.apply(AdmitOp(request_id="a", token_ids=[1, 2, 3, 4, 5, 6, 7, 8]))  # seq 1: blocks 1, 2
    e.apply(FinishOp(request_id="a"))  # seq 2
    e.apply(AllocateOp(num_blocks=6))  # seq 3: evicts block 2's hash
    rec = e.analysis.recorder  # type: ignore[union-attr]
    assert rec is not None
    a = moments.state_at(rec, 2, e.config)
    b = moments.state_at(rec, 3, e.config)
    d = moments.diff_json(a, b, rec.entries_between(2, 3), EventsView(e.events), 100)
    assert d["evicted_total"] == 1 and d["evicted"][0]["block_id"] == 2
    assert d["entered_total"] == 0
    assert d["ops"] == {"total": 1, "refused": 0, "by_type": {"allocate": 1}}
    assert d["events"] == {
        "stored_hashes": 0,
        "removed_hashes": 1,
        "cleared": 0,
        "ops_with_events_dropped": 0,
    }
    assert [c["block_id"] for c in d["blocks_changed"]] == [2, 3, 4, 5, 6, 7]
    assert d["blocks_changed"][0]["to"] == {"ref_cnt": 1, "hash64": None}


def test_keyframe_json_round_trip(engine_factory: Factory) -> None:
    from blockpool.runtime.state import keyframe_from_json, keyframe_json

    e = engine_factory(num_blocks=24)
    random_run(e, 4, 120)
    kf = snapshot(e.runtime, 7, 1.0)
    back = keyframe_from_json(json.loads(json.dumps(keyframe_json(kf))))
    fresh = moments.make_runtime(e.config)
    restore(fresh, back)
    assert digest(fresh) == digest(e.runtime)


def test_export_size_is_estimated_from_counters_and_gzip_replays(
    engine_factory: Factory, tmp_path: Path
) -> None:
    """The export's size comes from the recording's counters (sampled as it
    grows, nothing written): the lines exactly, the bytes within 15%; a
    gzip-compressed export replays as the plain one does."""
    import gzip

    from app.api.routes_analysis import gzip_stream

    e = engine_factory(num_blocks=24, recording_keyframe_ops=40)
    random_run(e, 7, 400, tick_every=3)
    rec = e.analysis.recorder  # type: ignore[union-attr]
    assert rec is not None
    lines = _lines(*rec.export_parts())
    est = rec.export_size()
    sampled = [seg.sample.copy() for seg in rec.segments]
    assert rec.export_size().lines == est.lines
    assert [seg.sample for seg in rec.segments] == sampled  # asking again wrote nothing more
    assert est.estimated is True and est.last_seq == rec.seq
    assert est.lines == len(lines)
    real = sum(len(x.encode()) for x in lines)
    assert abs(est.bytes - real) <= 0.15 * real, (est, real)
    path = tmp_path / "rec.jsonl.gz"
    path.write_bytes(b"".join(gzip_stream(iter(lines))))
    assert gzip.decompress(path.read_bytes()).decode() == "".join(lines)
    assert path.stat().st_size < real / 3
    report = replay.replay_file(path)
    assert report.ok and report.ops == rec.seq, report.as_dict()
    h = rec.horizon()
    assert h["full"] is False and h["held_seconds"] >= 0
