"""The pool at any recorded moment, and what changed between two moments.

A moment is an operation seq (the state after it) -- or a time, turned into
the last seq applied by then.  ``state_at`` restores the keyframe at or
before it into a fresh runtime (metadata only) and re-applies the operations
after it; the recording's ops were validated already, so replay is the
runtime's own code path (same block ids, same events).  ``state_json`` and
``diff_json`` are the views of a moment and of two: ``HistoryState`` and
``HistoryDiff``, the shapes ``GET /api/history/state`` and ``/diff`` send.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NotRequired

from blockpool.analysis.recording import Recorder
from blockpool.analysis.segment import Entry, EventsView, unpack
from blockpool.common.keys import key_group, key_hex
from blockpool.common.shapes import TypedDict, shape
from blockpool.core.events import BlockRemoved, BlockStored
from blockpool.core.snapshot import block_keys, map_entries
from blockpool.runtime.columns import STATE_NAMES
from blockpool.runtime.config import UNCAPPED, RuntimeConfig
from blockpool.runtime.errors import OperationError
from blockpool.runtime.runtime import PoolRuntime
from blockpool.runtime.state import RuntimeKeyframe, restore
from blockpool.runtime.summary import pool_summary


def make_runtime(config: RuntimeConfig | dict[str, Any] | Any) -> PoolRuntime:
    """A fresh metadata-only runtime of this configuration (a RuntimeConfig,
    or a recording header's settings)."""
    if not isinstance(config, RuntimeConfig):
        config = RuntimeConfig.from_mapping(config)
    return PoolRuntime(config)


def apply_entry(rt: PoolRuntime, op: Any, accepted: bool) -> tuple[bool, Any]:
    """Apply a recorded op: (ok, result or error).  One the writer accepted
    (``accepted``) applies again whatever the caps it was held to (the
    engine's own, a mirror's, were none); a refused one meets the
    configuration's caps again."""
    try:
        return True, rt.apply(op, UNCAPPED if accepted else None)
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
class RebuiltMoment:
    engine: PoolRuntime
    seq: int
    ts: float
    keyframe_seq: int
    replayed: int
    mismatches: int
    seconds: float


def state_at(recorder: Recorder, seq: int, config: RuntimeConfig) -> RebuiltMoment:
    """The state after op ``seq`` (held by the recording), rebuilt."""
    seg = recorder.segment_for(seq)
    if seg is None:
        raise LookupError(
            f"op seq {seq} is not held by the recording (held: "
            f"{recorder.first_seq}..{recorder.seq})"
        )
    return rebuild(seg.keyframe, seg.entries(0, seq - seg.keyframe.seq), config)


def rebuild(
    kf: RuntimeKeyframe, entries: list[Entry], config: RuntimeConfig | dict[str, Any]
) -> RebuiltMoment:
    t0 = time.perf_counter()
    engine = make_runtime(config)
    restore(engine, kf)
    bad = 0
    for entry in entries:
        _, _, op, rec_ok, rec_payload = unpack(entry)
        ok, payload = apply_entry(engine, op, rec_ok)
        if ok != rec_ok or (ok and jsonish(payload) != rec_payload):
            bad += 1
    last = entries[-1] if entries else None
    return RebuiltMoment(
        engine,
        last[0] if last else kf.seq,
        last[1] if last else kf.ts,
        kf.seq,
        len(entries),
        bad,
        time.perf_counter() - t0,
    )


# ------------------------------------------------------------------ views


@shape
class Moment(TypedDict):
    seq: int
    ts: float | None


@shape
class HistoryState(TypedDict):
    """The pool right after a recorded operation."""

    at: Moment
    keyframe_seq: int
    replayed_ops: int
    replay_mismatches: int
    replay_seconds: float
    summary: dict[str, Any]
    queue: dict[str, Any]
    hash_map: dict[str, Any]
    requests: dict[str, Any]
    blocks: NotRequired[dict[str, list[Any]] | None]
    """with include_blocks"""
    # set by the service, which keeps the series (app/pool/moment_tiles.py)
    tiles: NotRequired[dict[str, Any] | None]
    """the stat tiles then: usage, hit_rate_1m, hit_rate_5m, hit_rate_since (since_label), waiting from the server's series point at the moment (point_ts); null figures with a reason when the moment is older than that series.  On a mirror also running (the engine's then; null with running_reason), and the summary's running_requests / waiting_requests / requests_reason are the engine's"""  # noqa: E501 one line: the description


# ``from`` is a keyword: the functional form declares it
HistoryDiffFrom = TypedDict("HistoryDiffFrom", {"from": Moment})


@shape
class HistoryDiff(HistoryDiffFrom):
    """What changed between two recorded moments."""

    to: Moment
    evicted_total: int
    evicted: list[Any]
    entered_total: int
    entered: list[dict[str, Any]]
    blocks_changed_total: int
    blocks_changed: list[dict[str, Any]]
    requests: dict[str, Any]
    """started, ended (request ids), running_from, running_to.  On a mirror the engine's (source: engine): started = first scheduled in between, ended = finished in between; null figures with a reason where the mirror cannot know (it joined a busy engine, missed a batch, or the moment is older than it keeps)"""  # noqa: E501 one line: the description
    ops: dict[str, Any]
    events: dict[str, int]
    replayed_ops: int


def state_json(m: RebuiltMoment, limit: int, include_blocks: bool) -> HistoryState:
    e = m.engine
    pool = e.pool
    queue = [b.block_id for b in pool.free_block_queue]
    entries: list[dict[str, Any]] = []
    for key, entry in map_entries(pool).items():
        if len(entries) >= limit:
            break
        ids = list(entry) if entry.__class__ is dict else [entry.block_id]
        entries.append({"hash64": key_hex(key), "group_id": key_group(key), "block_ids": ids})
    reqs = [
        {
            "request_id": rid,
            "num_tokens": r.num_tokens,
            "block_ids": r.block_ids(),
            "num_hit_blocks": r.num_hit_blocks,
        }
        for rid, r in list(e.manager.requests.items())[:limit]
    ]
    out: HistoryState = {
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
            "hash64": [key_hex(k) for k in block_keys(pool)],
        }
    return out


def diff_json(
    a: RebuiltMoment, b: RebuiltMoment, between: list[Entry], view: EventsView, limit: int
) -> HistoryDiff:
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
    evicted = [
        {"hash64": key_hex(k), "block_id": i} for k, i in where_a.items() if k not in where_b
    ]
    entered = [
        {"hash64": key_hex(k), "block_id": i} for k, i in where_b.items() if k not in where_a
    ]
    changed = [
        {
            "block_id": i,
            "from": {"ref_cnt": ra[i], "hash64": key_hex(ka[i])},
            "to": {"ref_cnt": rb[i], "hash64": key_hex(kb[i])},
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
        ops[op.op] += 1
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


def jsonish(value: Any) -> Any:
    """``value`` as it reads back from JSON (how a recording keeps a result)."""
    return json.loads(json.dumps(value))
