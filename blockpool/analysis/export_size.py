"""The export's size, estimated (never by writing it), per segment: its
operations' lines (without events) sampled give line bytes per recorded
byte; its events, counted by kind, token ids and hashes as it grows (cheap:
no JSON), and some of them written, give their bytes; its keyframe is
written once.
"""

from __future__ import annotations

import bisect
import json
import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from blockpool import BlockRemoved, BlockStored
from blockpool.analysis.export import entry_json, event_to_json
from blockpool.analysis.segment import KINDS, Entry, EventsView, Sample, Segment
from blockpool.common.shapes import shape
from blockpool.runtime.state import RuntimeKeyframe, keyframe_json, snapshot

if TYPE_CHECKING:
    from blockpool import KVCacheEvent
    from blockpool.runtime.runtime import PoolRuntime

SAMPLE_STRIDE = 16  # one operation (event) in this many is written: a random one of each run
SAMPLES_PER_CALL = 64  # operations per segment and call at most (then sampled sparser)
EVENT_SAMPLES_PER_CALL = 256  # events likewise
SAMPLE_BUDGET = 0.005  # at tick time, sampling takes at most this share of the time
MEASURE_BUDGET = 0.01  # writing keyframes to measure them: at most this share of the time
STORED, REMOVED, OTHER = range(KINDS)


class NoEvents(EventsView):
    """An entry's line written as if it had no events (they are measured
    apart)."""

    def __init__(self) -> None:
        self.first, self.events = 0, []

    def of(self, entry: Entry) -> list[KVCacheEvent] | None:  # noqa: ARG002 overrides EventsView.of
        return []


NO_EVENTS = NoEvents()


def held_events(seg: Segment, first_held: int) -> tuple[int, int]:
    """(events of the segment's operations the event log holds now, all of
    their events)."""
    if not len(seg):
        return 0, 0
    lo, hi = seg.ev_first[0], seg.ev_first[-1] + seg.ev_n[-1]
    return max(0, hi - max(lo, first_held)), hi - lo


def _count_events(sm: Sample, events: list[KVCacheEvent]) -> None:
    kinds = sm.kinds
    for ev in events:
        if ev.__class__ is BlockStored:
            kinds[STORED] += 1
            sm.tokens += len(ev.token_ids)
            sm.hashes += len(ev.block_hashes)
        elif ev.__class__ is BlockRemoved:
            kinds[REMOVED] += 1
            sm.hashes += len(ev.block_hashes)
        else:
            kinds[OTHER] += 1


def _write_event(sm: Sample, ev: KVCacheEvent, w: int) -> None:
    line = event_to_json(ev)
    dumps = json.dumps
    rest = len(dumps(line))
    kind = OTHER
    if "token_ids" in line:
        kind = STORED
        n = len(dumps(line["token_ids"])) - 2
        sm.token_bytes += w * n
        sm.token_n += w * len(line["token_ids"])
        rest -= n
    if "block_hashes" in line:
        kind = kind if kind == STORED else REMOVED
        n = len(dumps(line["block_hashes"])) - 2
        sm.hash_bytes += w * n
        sm.hash_n += w * len(line["block_hashes"])
        rest -= n
    sm.rest_bytes[kind] += w * rest
    sm.rest_n[kind] += w


@shape
@dataclass
class ExportSize:
    """What ``GET /api/history/export`` would send now: the lines exactly,
    the bytes estimated from the recording's counters (nothing written)."""

    bytes: int
    lines: int
    last_seq: int
    # the defaults are the schema's (a dataclass, not a TypedDict, to declare them)
    estimated: bool = True
    json_per_recorded_byte: float = 0.0
    keyframe_bytes: int = 0


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


class ExportSizer:
    """A recording's export size: samples per segment (``Segment.sample``)
    taken at tick time; the final keyframe's line, measured at
    ``_final_seq``."""

    def __init__(self, engine: PoolRuntime, clock: Callable[[], float]) -> None:
        self.engine = engine
        self.clock = clock
        self._rng = random.Random(0)
        self._final_json = 0
        self._final_seq = -1
        self._next_measure = 0.0
        self._next_sample = 0.0

    def calibrate(self, segments: Sequence[Segment]) -> None:
        """Tick time: the operations recorded since the last call sampled
        (at most SAMPLE_BUDGET of the time), and one keyframe not yet
        measured written (at most MEASURE_BUDGET of the time)."""
        t0 = time.perf_counter()
        if t0 >= self._next_sample:
            for seg in segments:
                self.sample(seg)
            t1 = time.perf_counter()
            self._next_sample = t1 + (t1 - t0) / SAMPLE_BUDGET
        t0 = time.perf_counter()
        if t0 >= self._next_measure:
            todo = next((s for s in segments if not s.json_bytes), None)
            if todo is not None:
                todo.json_bytes = line_bytes("keyframe", todo.keyframe)
                t1 = time.perf_counter()
                self._next_measure = t1 + (t1 - t0) / MEASURE_BUDGET

    def sample(self, seg: Segment) -> None:
        """The segment's operations not yet covered: one random operation of
        each run of ``stride`` written (it stands for the run), and their
        events (those the log holds) counted, one in ``stride`` written."""
        sm = seg.sample
        lo, hi = sm.upto, len(seg)
        if hi <= lo:
            return
        rng, dumps = self._rng, json.dumps
        stride = max(SAMPLE_STRIDE, -(-(hi - lo) // SAMPLES_PER_CALL))
        base = seg.keyframe.seq + 1
        for run in range(lo, hi, stride):
            w = min(stride, hi - run)
            i = run + rng.randrange(w)
            entry = (base + i, seg.ts[i], seg.blobs[i], seg.ev_first[i], seg.ev_n[i])
            sm.line_bytes += w * (len(dumps(entry_json(entry, NO_EVENTS))) + 1)
            sm.pack_bytes += w * len(seg.blobs[i])
        sm.upto = hi
        sm.ops_with_events += sum(1 for n in seg.ev_n[lo:hi] if n)
        log = self.engine.events
        items, first = log._items, log.first_seq
        a = max(seg.ev_first[lo], first) - first
        b = min(seg.ev_first[hi - 1] + seg.ev_n[hi - 1] - first, len(items))
        if b <= a:
            return
        # the newest events: read from the log's end
        events = [ev for _, _, ev in islice(reversed(items), len(items) - b, len(items) - a)]
        _count_events(sm, events)
        sm.events += len(events)
        stride = max(SAMPLE_STRIDE, -(-len(events) // EVENT_SAMPLES_PER_CALL))
        for run in range(0, len(events), stride):
            w = min(stride, len(events) - run)
            _write_event(sm, events[run + rng.randrange(w)], w)

    def _held_counts(self, seg: Segment, first_held: int) -> tuple[Sample, int]:
        """A segment's events the log still holds, counted (those of its
        operations written with all their events), and how many of its
        operations had events and are written with ``null``."""
        k = bisect.bisect_left(seg.ev_first, first_held)
        nulls = sum(1 for n in seg.ev_n[:k] if n)
        counts = Sample()
        if k < len(seg):
            log = self.engine.events
            items = log._items
            a = seg.ev_first[k] - log.first_seq
            b = min(seg.ev_first[-1] + seg.ev_n[-1] - log.first_seq, len(items))
            events = [ev for _, _, ev in islice(items, a, b)]
            _count_events(counts, events)
            counts.events = len(events)
        return counts, nulls

    def estimate(
        self, segs: Sequence[Segment], seq: int, n_ops: int, nbytes: int, header: dict[str, Any]
    ) -> ExportSize:
        """What ``export_lines`` would write now, without writing it: the
        lines exactly, the bytes estimated: per segment, its sampled line
        bytes per recorded byte times its recorded bytes, and its events
        (counted by kind, token ids and hashes) times the bytes of each
        measured on the events written; each keyframe measured once (the
        final one again when operations came since, as MEASURE_BUDGET
        allows)."""
        for seg in segs:  # what ticks have not covered yet (bounded per segment)
            self.sample(seg)
            if not seg.json_bytes:
                seg.json_bytes = line_bytes("keyframe", seg.keyframe)
        t0 = time.perf_counter()
        if self._final_seq != seq and (t0 >= self._next_measure or not self._final_json):
            final = snapshot(self.engine, seq, self.clock())
            self._final_json, self._final_seq = line_bytes("final", final), seq
            t1 = time.perf_counter()
            self._next_measure = t1 + (t1 - t0) / MEASURE_BUDGET
        per_byte = _ratio(
            sum(s.sample.line_bytes for s in segs), sum(s.sample.pack_bytes for s in segs)
        )
        per_kind = [
            _ratio(sum(s.sample.rest_bytes[k] for s in segs), sum(s.sample.rest_n[k] for s in segs))
            for k in range(KINDS)
        ]
        per_token = _ratio(
            sum(s.sample.token_bytes for s in segs), sum(s.sample.token_n for s in segs)
        )
        per_hash = _ratio(
            sum(s.sample.hash_bytes for s in segs), sum(s.sample.hash_n for s in segs)
        )
        first_held = self.engine.events.first_seq
        ops = 0.0
        for seg in segs:
            sm = seg.sample
            ops += seg.nbytes * (_ratio(sm.line_bytes, sm.pack_bytes) or per_byte)
            held, total = held_events(seg, first_held)
            if not total:
                continue
            counts, nulls = sm, 0
            if held < total:  # the log has dropped the oldest: count what it holds
                counts, nulls = self._held_counts(seg, first_held)
            # "[e, e]" for "[]" where the log holds them, "null" where not
            written = sum(n * b for n, b in zip(counts.kinds, per_kind, strict=True))
            written += counts.tokens * per_token + counts.hashes * per_hash + 2 * counts.events
            ops += written - 2 * (sm.ops_with_events - nulls) + 2 * nulls
        head = len(json.dumps(header)) + 1
        kf = sum(seg.json_bytes for seg in segs) + self._final_json
        return ExportSize(
            bytes=int(head + kf + ops),
            lines=1 + len(segs) + 1 + n_ops,
            last_seq=seq,
            estimated=True,
            json_per_recorded_byte=ops / nbytes if nbytes else per_byte,
            keyframe_bytes=self._final_json,
        )


def _list_bytes(n: int, items: int) -> int:
    """What ``n`` items of ``items`` bytes in all add to an empty JSON list."""
    return items + 2 * (n - 1) if n else 0


# 10, 100, ... 10**18: an int's digits are one more than the powers it reaches
_POW10 = np.array([10**k for k in range(1, 19)], dtype=np.int64)


def _digits(values: Any) -> int:
    """The characters of these ints written in decimal, all of them
    together (a minus sign included): counted, not written."""
    a = np.asarray(values, dtype=np.int64)
    if not a.size:
        return 0
    reached = np.searchsorted(_POW10, np.abs(a), side="right")
    return int(a.size + int(reached.sum()) + int(np.count_nonzero(a < 0)))


def line_bytes(kind: str, kf: RuntimeKeyframe) -> int:
    """The bytes of the keyframe's export line, exactly, without writing its
    per-block lists (a pool of 131,072 blocks: tens of MB of JSON, half a
    second of the writer's time): an int list's JSON is its repr (its
    digits counted, ``_digits``), a hash is its hex in quotes, and the rest
    is written with those lists empty."""
    ps = kf.pool
    none = array("i")
    bare = replace(ps, refs=none, keys=[], queue=none, map_keys=[], map_ids=none, map_dicts={})
    d = {"type": kind, **keyframe_json(replace(kf, pool=bare, raw_refs=[]))}
    n = len(json.dumps(d)) + 1
    n += _list_bytes(len(ps.refs), _digits(ps.refs)) + _list_bytes(len(ps.queue), _digits(ps.queue))
    raw = kf.raw_refs  # [[block, count], ...]: "[" a ", " b "]" each
    n += _list_bytes(len(raw), 4 * len(raw) + _digits(raw))
    keys = ps.keys  # null, or a hash's hex in quotes
    unset = keys.count(None)
    hexed = 2 * sum(map(len, filter(None, keys)))
    n += _list_bytes(len(keys), 4 * unset + hexed + 2 * (len(keys) - unset))
    m = len(ps.map_keys)
    if m:
        values = _digits(ps.map_ids)
        for i, tup in ps.map_dicts.items():  # a promoted entry: its ids' list instead
            values += len(str(list(tup))) - _digits([ps.map_ids[i]])
        n += _list_bytes(m, 6 * m + 2 * sum(map(len, ps.map_keys)) + values)
    return n
