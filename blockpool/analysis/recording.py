"""The recording: every operation the engine applied, with its result and
events, in segments that each start with a keyframe.

On the hot path ``record`` encodes the validated op's fields and its result
or error into one msgpack blob (msgspec, in C: ~0.3 us for a decode step,
~2 us for a 700-token admission) and keeps ``(seq, time, blob, first event
seq, event count)``: the events themselves stay in the engine's event log
(which holds them anyway), found again by their seq for an export or a diff
(``null`` there once that bounded log has dropped them).  Keeping the op
models, result dicts and event lists themselves would cost far more: every
retained container is traversed by the garbage collector again and again
(measured: -20% engine throughput), and a token id as a Python int takes 36
bytes against ~3 in msgpack.

At tick time, once the current segment holds ``keyframe_ops`` operations, a
keyframe closes it (an O(blocks) snapshot between two operations).  The
recording is bounded by operations and by encoded bytes: when over either
bound the oldest segment goes, so the recording always starts at a keyframe.

The state at any recorded moment is its segment's keyframe plus the
operations up to that moment, replayed into a fresh engine (``moments.py``).
The entries and segments are in ``segment.py``; the export (JSON lines)
in ``export.py``.
"""

from __future__ import annotations

import bisect
import json
import random
import time
from array import array
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

from blockpool import BlockRemoved, BlockStored
from blockpool.analysis.export import entry_json, event_to_json, header_json
from blockpool.analysis.segment import KINDS, Entry, EventsView, Sample, Segment, encode
from blockpool.runtime.state import Keyframe, keyframe_json, snapshot

if TYPE_CHECKING:
    from blockpool import KVCacheEvent
    from blockpool.runtime.runtime import PoolRuntime

KEYFRAME_BUDGET = 0.01  # at tick time, keyframes take at most this share of the time
# The export's size, estimated (never by writing it), per segment: its
# operations' lines (without events) sampled give line bytes per recorded
# byte; its events, counted by kind, token ids and hashes as it grows (cheap:
# no JSON), and some of them written, give their bytes; its keyframe is
# written once.
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

    def of(self, entry: Entry) -> list[KVCacheEvent] | None:
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


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


class Recorder:
    def __init__(
        self,
        engine: PoolRuntime,
        max_ops: int,
        max_bytes: int,
        keyframe_ops: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.max_ops = max_ops
        self.max_bytes = max_bytes
        self.keyframe_ops = keyframe_ops
        self.seq = 0
        self.ops = 0
        self.nbytes = 0
        self.dropped_ops = 0
        self.dropped_segments = 0
        self.keyframes_taken = 0
        self.due = False
        self._next_keyframe = 0.0
        self.keyframe_seconds = 0.0
        self.segments: deque[Segment] = deque()
        self.segments.append(Segment(self._snapshot()))
        # the export's size: samples per segment (``Segment.sample``); the
        # final keyframe's line, measured at ``_final_seq``
        self._rng = random.Random(0)
        self._final_json = 0
        self._final_seq = -1
        self._next_measure = 0.0
        self._next_sample = 0.0

    def _snapshot(self) -> Keyframe:
        t0 = time.perf_counter()
        kf = snapshot(self.engine, self.seq, self.clock())
        t1 = time.perf_counter()
        self.keyframes_taken += 1
        self.keyframe_seconds += t1 - t0
        self._next_keyframe = t1 + (t1 - t0) / KEYFRAME_BUDGET
        return kf

    # ----------------------------------------------------------- hot path

    def record(self, op: Any, ok: bool, payload: Any, first_event: int, n_events: int) -> None:
        """``first_event``: the event-log seq its first event will get (the
        engine absorbs them right after)."""
        self.seq += 1
        seg = self.segments[-1]
        blob = encode((op.__class__.__name__, op, ok, payload))
        seg.blobs.append(blob)
        seg.ts.append(self.clock())
        seg.ev_first.append(first_event)
        seg.ev_n.append(n_events)
        n = len(blob)
        seg.nbytes += n
        self.nbytes += n
        self.ops += 1
        if len(seg) >= 2 * self.keyframe_ops:
            # No ticks (a bench, a test): a keyframe before the next operation
            # (not now: the engine has not absorbed this one's events yet).
            self.due = True
        elif self.ops > self.max_ops or self.nbytes > self.max_bytes:
            self._enforce()

    # ----------------------------------------------------------- tick time

    def maybe_keyframe(self) -> None:
        """Tick time: a keyframe once the segment holds ``keyframe_ops``
        operations -- and no sooner than KEYFRAME_BUDGET allows (a keyframe
        of a large pool costs milliseconds; then segments grow longer)."""
        if (
            len(self.segments[-1]) >= self.keyframe_ops
            and time.perf_counter() >= self._next_keyframe
        ):
            self.keyframe()
        self.calibrate()

    def calibrate(self) -> None:
        """Tick time: the operations recorded since the last call sampled
        (at most SAMPLE_BUDGET of the time), and one keyframe not yet
        measured written (at most MEASURE_BUDGET of the time)."""
        t0 = time.perf_counter()
        if t0 >= self._next_sample:
            for seg in self.segments:
                self._sample(seg)
            t1 = time.perf_counter()
            self._next_sample = t1 + (t1 - t0) / SAMPLE_BUDGET
        t0 = time.perf_counter()
        if t0 >= self._next_measure:
            todo = next((s for s in self.segments if not s.json_bytes), None)
            if todo is not None:
                todo.json_bytes = _line_bytes("keyframe", todo.keyframe)
                t1 = time.perf_counter()
                self._next_measure = t1 + (t1 - t0) / MEASURE_BUDGET

    def _sample(self, seg: Segment) -> None:
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

    def export_size(self) -> dict[str, Any]:
        """What ``export_lines`` would write now, without writing it: the
        lines exactly, the bytes estimated: per segment, its sampled line
        bytes per recorded byte times its recorded bytes, and its events
        (counted by kind, token ids and hashes) times the bytes of each
        measured on the events written; each keyframe measured once (the
        final one again when operations came since, as MEASURE_BUDGET
        allows)."""
        segs = self.segments
        for seg in segs:  # what ticks have not covered yet (bounded per segment)
            self._sample(seg)
            if not seg.json_bytes:
                seg.json_bytes = _line_bytes("keyframe", seg.keyframe)
        t0 = time.perf_counter()
        if self._final_seq != self.seq and (t0 >= self._next_measure or not self._final_json):
            final = snapshot(self.engine, self.seq, self.clock())
            self._final_json, self._final_seq = _line_bytes("final", final), self.seq
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
        header = len(json.dumps(self._header())) + 1
        kf = sum(seg.json_bytes for seg in segs) + self._final_json
        return {
            "bytes": int(header + kf + ops),
            "lines": 1 + len(segs) + 1 + self.ops,
            "last_seq": self.seq,
            "estimated": True,
            "json_per_recorded_byte": ops / self.nbytes if self.nbytes else per_byte,
            "keyframe_bytes": self._final_json,
        }

    def horizon(self) -> dict[str, Any]:
        """How far back the recording reaches: held now, and at the current
        rate once its bounds are reached (``None`` before any operation)."""
        held = max(0.0, self.last_ts() - self.first_ts)
        full = self.dropped_segments > 0
        if full or not self.ops or held <= 0:
            return {"held_seconds": held, "full": full, "seconds": held if full else None}
        by_ops = self.max_ops / self.ops
        by_bytes = self.max_bytes / self.nbytes if self.nbytes else by_ops
        return {"held_seconds": held, "full": False, "seconds": held * min(by_ops, by_bytes)}

    def keyframe(self) -> None:
        """Between operations only (tick time, or before the next one)."""
        self.due = False
        self.segments.append(Segment(self._snapshot()))
        self._enforce()

    def _enforce(self) -> None:
        segs = self.segments
        while len(segs) > 1 and (self.ops > self.max_ops or self.nbytes > self.max_bytes):
            old = segs.popleft()
            self.ops -= len(old)
            self.nbytes -= old.nbytes
            self.dropped_ops += len(old)
            self.dropped_segments += 1

    # --------------------------------------------------------------- reads

    @property
    def first_seq(self) -> int:
        """The earliest moment held: the first keyframe's seq."""
        return self.segments[0].keyframe.seq

    @property
    def first_ts(self) -> float:
        return self.segments[0].keyframe.ts

    def last_ts(self) -> float:
        seg = self.segments[-1]
        return seg.ts[-1] if len(seg) else seg.keyframe.ts

    def seq_at(self, ts: float) -> int:
        """The last op seq applied at or before ``ts`` (the first keyframe's
        seq when ``ts`` is before every op held)."""
        best = self.first_seq
        for seg in self.segments:
            if seg.keyframe.ts > ts:
                break
            best = seg.keyframe.seq + bisect.bisect_right(seg.ts, ts)
        return best

    def ts_of(self, seq: int) -> float:
        seg = self.segment_for(seq)
        if seg is None:
            return float("nan")
        if seq == seg.keyframe.seq:
            return seg.keyframe.ts
        return seg.ts[seq - seg.keyframe.seq - 1]

    def segment_for(self, seq: int) -> Segment | None:
        """The segment whose keyframe is the last at or before ``seq``."""
        if seq < self.first_seq or seq > self.seq:
            return None
        seqs = [s.keyframe.seq for s in self.segments]
        return self.segments[bisect.bisect_right(seqs, seq) - 1]

    def columns_between(self, after: int, upto: int) -> list[tuple[array[float], list[bytes]]]:
        """(times, blobs) of the operations with ``after < seq <= upto``, a
        slice of each segment's columns (cheap to pickle)."""
        out = []
        for seg in self.segments:
            kf = seg.keyframe.seq
            last = kf + len(seg)
            if not len(seg) or last <= after or kf >= upto:
                continue
            lo, hi = max(0, after - kf), min(len(seg), upto - kf)
            out.append((seg.ts[lo:hi], seg.blobs[lo:hi]))
        return out

    def entries_between(self, after: int, upto: int) -> list[Entry]:
        """Entries with ``after < seq <= upto`` (held ones)."""
        out: list[Entry] = []
        for seg in self.segments:
            last = seg.keyframe.seq + len(seg)
            if not len(seg) or last <= after or seg.keyframe.seq >= upto:
                continue
            out.extend(seg.entries(after - seg.keyframe.seq, upto - seg.keyframe.seq))
        return out

    def info(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "first_seq": self.first_seq,
            "last_seq": self.seq,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts(),
            "ops_held": self.ops,
            "bytes_held": self.nbytes,
            "dropped_ops": self.dropped_ops,
            "dropped_segments": self.dropped_segments,
            "keyframes": [{"seq": s.keyframe.seq, "ts": s.keyframe.ts} for s in self.segments],
            "keyframes_taken": self.keyframes_taken,
            "horizon": self.horizon(),
            "keyframe_seconds_total": self.keyframe_seconds,
            "limits": {
                "max_ops": self.max_ops,
                "max_bytes": self.max_bytes,
                "keyframe_ops": self.keyframe_ops,
            },
        }

    # -------------------------------------------------------------- export

    def export_parts(self) -> tuple[dict[str, Any], list[Segment], Keyframe, EventsView]:
        """On the engine's loop: what an export needs, consistent at one
        moment (the segments' lists are copied; the final keyframe is now)."""
        header = self._header()
        segs = [seg.copy() for seg in self.segments]
        final = snapshot(self.engine, self.seq, self.clock())
        return header, segs, final, EventsView(self.engine.events)

    def _header(self) -> dict[str, Any]:
        return header_json(self.engine, self.first_seq, self.seq)


def _line_bytes(kind: str, kf: Keyframe) -> int:
    return len(json.dumps({"type": kind, **keyframe_json(kf)})) + 1
