"""Time travel: the pool at any recorded moment, the difference between two
moments, and replaying a recording file.

A moment is an operation seq (the state after it) -- or a time, turned into
the last seq applied by then.  ``state_at`` restores the keyframe at or
before it into a fresh runtime (metadata only) and re-applies the operations
after it; the recording's ops were validated already, so replay is the
runtime's own code path (same block ids, same events).

    python -m blockpool.analysis.replay RECORDING.jsonl [--json]
    blockpool replay RECORDING.jsonl [--json]

replays an exported recording from its first keyframe and checks every
operation's result and events, and the final state, against the file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from blockpool.analysis.recording import (
    FORMAT,
    Entry,
    EventsView,
    Recorder,
    event_from_json,
    unpack,
)
from blockpool.events import BlockRemoved, BlockStored
from blockpool.keys import key64, key_group
from blockpool.runtime.columns import STATE_NAMES
from blockpool.runtime.config import RuntimeConfig
from blockpool.runtime.errors import OperationError
from blockpool.runtime.ops import op_from_json
from blockpool.runtime.runtime import PoolRuntime
from blockpool.runtime.state import Keyframe, digest, keyframe_from_json, restore, snapshot
from blockpool.runtime.summary import pool_summary
from blockpool.snapshot import block_keys, map_entries


def make_runtime(config: RuntimeConfig | dict[str, Any] | Any) -> PoolRuntime:
    """A fresh metadata-only runtime of this configuration (a RuntimeConfig,
    or a recording header's settings)."""
    if not isinstance(config, RuntimeConfig):
        config = RuntimeConfig.from_mapping(config)
    return PoolRuntime(config)


def apply_entry(rt: PoolRuntime, op: Any) -> tuple[bool, Any]:
    """Apply a recorded op: (ok, result or error)."""
    try:
        return True, rt.apply(op)
    except OperationError as exc:
        return False, exc.as_dict()


def parse_moment(recorder: Recorder, at: str) -> int:
    """An op seq, a Unix time (>= 1e9) or an ISO 8601 time -> an op seq."""
    text = at.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{at!r} is not an op seq, a Unix time or an ISO 8601 time") from None
        return recorder.seq_at(when.timestamp())
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{at!r} is not a moment")
    if value >= 1e9:
        return recorder.seq_at(value)
    if value != int(value):
        raise ValueError(f"{at!r}: an op seq is a whole number")
    return int(value)


@dataclass
class Moment:
    engine: PoolRuntime
    seq: int
    ts: float
    keyframe_seq: int
    replayed: int
    mismatches: int
    seconds: float


def state_at(recorder: Recorder, seq: int, config: RuntimeConfig) -> Moment:
    """The state after op ``seq`` (held by the recording), rebuilt."""
    seg = recorder.segment_for(seq)
    if seg is None:
        raise LookupError(
            f"op seq {seq} is not held by the recording (held: "
            f"{recorder.first_seq}..{recorder.seq})"
        )
    return rebuild(seg.keyframe, seg.entries(0, seq - seg.keyframe.seq), config)


def rebuild(kf: Keyframe, entries: list[Entry], config: RuntimeConfig | dict[str, Any]) -> Moment:
    t0 = time.perf_counter()
    engine = make_runtime(config)
    restore(engine, kf)
    bad = 0
    for entry in entries:
        _, _, op, rec_ok, rec_payload = unpack(entry)
        ok, payload = apply_entry(engine, op)
        if ok != rec_ok or (ok and _jsonish(payload) != rec_payload):
            bad += 1
    last = entries[-1] if entries else None
    return Moment(
        engine,
        last[0] if last else kf.seq,
        last[1] if last else kf.ts,
        kf.seq,
        len(entries),
        bad,
        time.perf_counter() - t0,
    )


# ------------------------------------------------------------------ views


def _h(key: bytes | None) -> str | None:
    return None if key is None else f"{key64(key):016x}"


def state_json(m: Moment, limit: int, include_blocks: bool) -> dict[str, Any]:
    e = m.engine
    pool = e.pool
    queue = [b.block_id for b in pool.free_block_queue]
    entries: list[dict[str, Any]] = []
    for key, entry in map_entries(pool).items():
        if len(entries) >= limit:
            break
        ids = list(entry) if entry.__class__ is dict else [entry.block_id]
        entries.append({"hash64": _h(key), "group_id": key_group(key), "block_ids": ids})
    reqs = [
        {
            "request_id": rid,
            "num_tokens": r.num_tokens,
            "block_ids": r.block_ids(),
            "num_hit_blocks": r.num_hit_blocks,
        }
        for rid, r in list(e.manager.requests.items())[:limit]
    ]
    out: dict[str, Any] = {
        "at": {"seq": m.seq, "ts": m.ts},
        "keyframe_seq": m.keyframe_seq,
        "replayed_ops": m.replayed,
        "replay_mismatches": m.mismatches,
        "replay_seconds": m.seconds,
        "summary": pool_summary(e),
        "queue": {"total": len(queue), "block_ids": queue[:limit]},
        "hash_map": {"total_keys": len(pool.cached_block_hash_to_block), "items": entries},
        "requests": {"total": len(e.manager.requests), "items": reqs},
    }
    if include_blocks:
        cols = e.columns
        out["blocks"] = {
            "state": [STATE_NAMES[int(s)] for s in cols.state.tolist()],
            "ref_cnt": cols.ref_cnt.tolist(),
            "hash64": [_h(k) for k in block_keys(pool)],
        }
    return out


def diff_json(
    a: Moment, b: Moment, between: list[Entry], view: EventsView, limit: int
) -> dict[str, Any]:
    """What changed from moment ``a`` to moment ``b``."""
    ka = block_keys(a.engine.pool)
    kb = block_keys(b.engine.pool)
    ra = [blk.ref_cnt for blk in a.engine.pool.blocks]
    rb = [blk.ref_cnt for blk in b.engine.pool.blocks]
    where_a: dict[bytes, int] = {}
    for i, k in enumerate(ka):
        if k is not None:
            where_a.setdefault(k, i)
    where_b: dict[bytes, int] = {}
    for i, k in enumerate(kb):
        if k is not None:
            where_b.setdefault(k, i)
    evicted = [{"hash64": _h(k), "block_id": i} for k, i in where_a.items() if k not in where_b]
    entered = [{"hash64": _h(k), "block_id": i} for k, i in where_b.items() if k not in where_a]
    changed = [
        {
            "block_id": i,
            "from": {"ref_cnt": ra[i], "hash64": _h(ka[i])},
            "to": {"ref_cnt": rb[i], "hash64": _h(kb[i])},
        }
        for i in range(1, len(ka))
        if ka[i] != kb[i] or ra[i] != rb[i]
    ]
    ops: Counter[str] = Counter()
    failed = 0
    stored = removed = cleared = 0
    unknown = 0
    for entry in between:
        _, _, op, ok, _ = unpack(entry)
        ops[type(op).__name__.removesuffix("Op").lower()] += 1
        failed += not ok
        events = view.of(entry)
        if events is None:
            unknown += 1
            continue
        for ev in events:
            if isinstance(ev, BlockStored):
                stored += len(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                removed += len(ev.block_hashes)
            else:
                cleared += 1
    reqs_a, reqs_b = set(a.engine.manager.requests), set(b.engine.manager.requests)
    return {
        "from": {"seq": a.seq, "ts": a.ts},
        "to": {"seq": b.seq, "ts": b.ts},
        "evicted_total": len(evicted),
        "evicted": evicted[:limit],
        "entered_total": len(entered),
        "entered": entered[:limit],
        "blocks_changed_total": len(changed),
        "blocks_changed": changed[:limit],
        "requests": {
            "started": sorted(reqs_b - reqs_a)[:limit],
            "ended": sorted(reqs_a - reqs_b)[:limit],
            "running_from": len(reqs_a),
            "running_to": len(reqs_b),
        },
        "ops": {"total": len(between), "refused": failed, "by_type": dict(ops)},
        "events": {
            "stored_hashes": stored,
            "removed_hashes": removed,
            "cleared": cleared,
            "ops_with_events_dropped": unknown,  # from the bounded event log
        },
        "replayed_ops": a.replayed + b.replayed,
    }


# ----------------------------------------------------------- replay a file


@dataclass
class ReplayReport:
    path: str
    ops: int = 0
    refused: int = 0
    keyframes: int = 0
    result_mismatches: int = 0
    event_mismatches: int = 0
    keyframe_mismatches: int = 0
    events_unknown: int = 0
    final_matches: bool | None = None
    first_problem: str | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.result_mismatches == 0
            and self.event_mismatches == 0
            and self.keyframe_mismatches == 0
            and self.final_matches is not False
        )

    def note(self, problem: str) -> None:
        if self.first_problem is None:
            self.first_problem = problem
        if len(self.problems) < 50:
            self.problems.append(problem)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "ops": self.ops,
            "refused": self.refused,
            "keyframes": self.keyframes,
            "result_mismatches": self.result_mismatches,
            "event_mismatches": self.event_mismatches,
            "keyframe_mismatches": self.keyframe_mismatches,
            "events_unknown": self.events_unknown,
            "final_matches": self.final_matches,
            "first_problem": self.first_problem,
            "problems": self.problems,
            "seconds": self.seconds,
        }


def read_lines(path: str | Path) -> Iterator[dict[str, Any]]:
    """The recording's JSON objects (a ``.gz`` file, or any gzip file,
    uncompressed); ValueError naming the line of one that is not."""
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    opener: Any = gzip.open if gz else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except RecursionError:
                raise ValueError(
                    f"{path}: line {n}: not JSON this reads: nested too deeply"
                ) from None
            except ValueError as exc:  # bad JSON, or an integer past 4300 digits
                why = str(exc).split(";")[0]
                raise ValueError(f"{path}: line {n}: not JSON this reads: {why}") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}: line {n}: a record must be a JSON object")
            yield rec


# A header's pool settings, at most (the service's own bounds): a recording
# cannot make a replay build a pool larger than a server could have had.
HEADER_BOUNDS = {"num_blocks": (2, 4_000_000), "block_size": (1, 1024), "num_groups": (1, 16)}


def _check_settings(settings: Any, path: str) -> dict[str, Any]:
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: line 1: the header's settings must be a JSON object")
    for name, (lo, hi) in HEADER_BOUNDS.items():
        v = settings.get(name)
        if v is None and name != "num_blocks":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(
                f"{path}: line 1: settings.{name} must be an integer {lo}..{hi}, got {v!r:.40}"
            )
    return settings


def replay_records(
    records: Iterable[dict[str, Any]], path: str = "-"
) -> tuple[ReplayReport, PoolRuntime]:
    """Replay parsed JSON lines; returns the report and the engine at the end."""
    report = ReplayReport(path)
    t0 = time.perf_counter()
    it = iter(records)
    header = next(it, None)
    if (
        not isinstance(header, dict)
        or header.get("type") != "header"
        or header.get("format") != FORMAT
    ):
        raise ValueError(f"{path}: not a {FORMAT} file (the first line must be its header)")
    engine = make_runtime(_check_settings(header.get("settings"), path))
    started = False
    for n, rec in enumerate(it, start=2):
        try:
            started = _replay_record(engine, report, rec, started)
        except (KeyError, TypeError, AttributeError, ValueError, OperationError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"{path}: record {n}: {what}"[:400]) from None
    report.seconds = time.perf_counter() - t0
    return report, engine


def _replay_record(engine: PoolRuntime, report: ReplayReport, rec: Any, started: bool) -> bool:
    """One record of a recording, checked against the replay; whether the
    replay has started (its first keyframe restored)."""
    if not isinstance(rec, dict):
        raise ValueError("a record must be a JSON object")
    kind = rec.get("type")
    if kind == "keyframe":
        kf = keyframe_from_json(rec)
        report.keyframes += 1
        if not started:
            restore(engine, kf)
            started = True
        elif _kf_digest(engine, kf) != digest(engine):
            report.keyframe_mismatches += 1
            report.note(f"state after op {kf.seq} differs from the recorded keyframe")
    elif kind == "op":
        if not started:
            raise ValueError("an operation before the first keyframe")
        op = op_from_json(rec["op"])
        before = engine.events.last_seq
        ok, payload = apply_entry(engine, op)
        report.ops += 1
        report.refused += not ok
        want = rec.get("result") if rec["ok"] else _error(rec.get("error"))
        if ok != rec["ok"] or _jsonish(payload) != want:
            report.result_mismatches += 1
            report.note(
                f"op {rec['seq']} ({rec['op'].get('op')}): got {payload!r}, recorded {want!r}"
            )
        events, _ = engine.events.since(before, 1 << 30)
        got = [ev for _, _, ev in events]
        want_events = rec["events"]
        if want_events is None:  # not in the recording (dropped from the event log)
            report.events_unknown += 1
        elif got != [event_from_json(d) for d in want_events]:
            report.event_mismatches += 1
            report.note(f"op {rec['seq']}: events differ")
    elif kind == "final":
        kf = keyframe_from_json(rec)
        report.final_matches = _kf_digest(engine, kf) == digest(engine)
        if not report.final_matches:
            report.note("the final state differs from the recorded one")
    return started


def replay_file(path: str | Path) -> ReplayReport:
    """Replay an exported recording file and check it (see ReplayReport.ok)."""
    report, _ = replay_records(read_lines(path), str(path))
    return report


def _jsonish(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _error(recorded: Any) -> Any:
    """A recorded refusal as the runtime reports it (older recordings also
    kept the HTTP status)."""
    if isinstance(recorded, dict):
        return {k: v for k, v in recorded.items() if k != "status"}
    return recorded


def _kf_digest(like: PoolRuntime, kf: Keyframe) -> dict[str, Any]:
    """The digest of a keyframe's state (restored into a scratch runtime)."""
    scratch = make_runtime(like.config)
    restore(scratch, kf)
    return digest(scratch)


def snapshot_digest(engine: PoolRuntime) -> dict[str, Any]:
    """Round trip through a keyframe (tests: snapshot + restore is exact)."""
    kf = snapshot(engine, 0, time.time())
    return _kf_digest(engine, kf)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="blockpool replay",
        description="Replay a blockpool recording (GET /api/history/export) and check it.",
    )
    ap.add_argument("path", help="the JSON-lines recording")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    try:
        report = replay_file(args.path)
    except (OSError, ValueError, KeyError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(
            f"{report.path}: {report.ops} ops ({report.refused} refused), "
            f"{report.keyframes} keyframes, {report.seconds:.2f}s: "
            + ("OK, same results, events and states" if report.ok else "MISMATCH")
        )
        for p in report.problems[:10]:
            print(f"  - {p}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
