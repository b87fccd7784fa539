"""Replaying a recording file: from its first keyframe, every operation's
result and events, every keyframe and the final state checked against the
file (the moments of a live recording are in ``moments.py``).

A ReplayRequest in, a ReplayReport out (``replay_recording``); the command
``blockpool replay RECORDING.jsonl [--json]`` (``app/cli/replay.py``) reads
its flags and prints the report.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from blockpool.analysis.export import FORMAT, event_from_json
from blockpool.analysis.moments import apply_entry, jsonish, make_runtime
from blockpool.core.free_order import APPEND_ALL, FREE_ORDERS
from blockpool.runtime.errors import OperationError
from blockpool.runtime.ops import op_from_json
from blockpool.runtime.runtime import PoolRuntime
from blockpool.runtime.state import RuntimeKeyframe, digest, keyframe_from_json, restore, snapshot


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
    # the pool replayed: its free order (the header's; older recordings
    # have none: vLLM 0.16's) and, for a mirror's, the engine it followed
    # (its prefix-cache counters are the engine's: not compared)
    free_order: str = APPEND_ALL
    engine: str | None = None
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
        return {**asdict(self), "ok": self.ok}


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
    order = settings.get("free_order")
    if order is not None and order not in FREE_ORDERS:
        raise ValueError(
            f"{path}: line 1: settings.free_order must be one of {', '.join(FREE_ORDERS)}, "
            f"got {order!r:.40}"
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
    settings = _check_settings(header.get("settings"), path)
    report.free_order = settings.get("free_order", APPEND_ALL)
    facts = header.get("engine")
    if isinstance(facts, dict):
        version = facts.get("vllm_version")
        report.engine = f"vLLM {version}" if isinstance(version, str) else "an engine"
    engine = make_runtime(settings)
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
        elif not _same_state(engine, kf, report.engine is not None):
            report.keyframe_mismatches += 1
            report.note(f"state after op {kf.seq} differs from the recorded keyframe")
    elif kind == "op":
        if not started:
            raise ValueError("an operation before the first keyframe")
        op = op_from_json(rec["op"])
        before = engine.events.last_seq
        ok, payload = apply_entry(engine, op, bool(rec["ok"]))
        report.ops += 1
        report.refused += not ok
        want = rec.get("result") if rec["ok"] else _error(rec.get("error"))
        if ok != rec["ok"] or jsonish(payload) != want:
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
        report.final_matches = _same_state(engine, kf, report.engine is not None)
        if not report.final_matches:
            report.note("the final state differs from the recorded one")
    return started


@dataclass(frozen=True)
class ReplayRequest:
    """A replay: the exported recording file it reads (JSON lines, or gzip)."""

    path: str | Path


def replay_recording(request: ReplayRequest) -> ReplayReport:
    """Replay the request's recording and check it (see ReplayReport.ok);
    OSError when it cannot be read, ValueError naming the line or record
    of a file it cannot replay."""
    return replay_file(request.path)


def replay_file(path: str | Path) -> ReplayReport:
    """Replay an exported recording file and check it (see ReplayReport.ok)."""
    report, _ = replay_records(read_lines(path), str(path))
    return report


def _error(recorded: Any) -> Any:
    """A recorded refusal as the runtime reports it (older recordings also
    kept the HTTP status)."""
    if isinstance(recorded, dict):
        return {k: v for k, v in recorded.items() if k != "status"}
    return recorded


def _same_state(engine: PoolRuntime, kf: RuntimeKeyframe, mirror: bool) -> bool:
    """Whether the replay's state is the keyframe's.  A mirror's prefix-cache
    counters are the engine's, copied from its batches (no operation of the
    pool's changes them): its pool, refs, hashes, queue and counters are
    compared, not those."""
    want, got = _kf_digest(engine, kf), digest(engine)
    if mirror:
        want.pop("stats", None)
        got.pop("stats", None)
    return want == got


def _kf_digest(like: PoolRuntime, kf: RuntimeKeyframe) -> dict[str, Any]:
    """The digest of a keyframe's state (restored into a scratch runtime)."""
    scratch = make_runtime(like.config)
    restore(scratch, kf)
    return digest(scratch)


def snapshot_digest(engine: PoolRuntime) -> dict[str, Any]:
    """Round trip through a keyframe (tests: snapshot + restore is exact)."""
    kf = snapshot(engine, 0, time.time())
    return _kf_digest(engine, kf)
