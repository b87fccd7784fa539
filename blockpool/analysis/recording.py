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
in ``export.py``, its size estimated in ``export_size.py``.
"""

from __future__ import annotations

import bisect
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blockpool.analysis.export import header_json
from blockpool.analysis.export_size import ExportSize, ExportSizer
from blockpool.analysis.segment import Entry, EventsView, Segment, encode
from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.state import RuntimeKeyframe, snapshot

if TYPE_CHECKING:
    from blockpool.runtime.runtime import PoolRuntime

KEYFRAME_BUDGET = 0.01  # at tick time, keyframes take at most this share of the time
# Between ticks a segment ends after ``forced_ops`` operations: twice
# keyframe_ops, or up to FORCED_KEYFRAME times that on a large pool (a
# keyframe costs O(pool): one per num_blocks / 8 operations at most, so a
# mirror applying a GPU engine's steps does not stall its writer on them).
FORCED_KEYFRAME = 8


@shape
class Keyframe(TypedDict):
    seq: int
    ts: float


@shape
@dataclass
class History:
    """The recording: the span it holds, its keyframes, its limits."""

    enabled: bool
    # the defaults are the schema's (a dataclass, not a TypedDict, to declare them)
    first_seq: int | None = None
    last_seq: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None
    ops_held: int | None = None
    bytes_held: int | None = None
    dropped_ops: int | None = None
    dropped_segments: int | None = None
    keyframes: Sequence[Keyframe] = ()
    keyframes_taken: int | None = None
    horizon: dict[str, Any] | None = None
    """held_seconds: the span held; seconds: how far back it reaches once full, at the current rate (null before any operation); full: its bounds reached"""  # noqa: E501 one line: the description
    keyframe_seconds_total: float | None = None
    limits: dict[str, int] | None = None


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
        self.forced_ops = max(
            2 * keyframe_ops, min(FORCED_KEYFRAME * keyframe_ops, len(engine.pool.blocks) // 8)
        )
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
        self.sizer = ExportSizer(engine, clock)
        # a mirror's: what the engine is, and its requests since a time as lines
        self.engine_facts: dict[str, Any] | None = None
        self._requests: Callable[[float], Iterable[str]] | None = None

    def describe_engine(
        self, facts: dict[str, Any], requests: Callable[[float], Iterable[str]] | None = None
    ) -> None:
        """A mirror's recording: ``facts`` (what the engine is: vLLM version,
        blocks, block size, hash function, free order...) go in the export's
        header; ``requests(since)``, the engine's requests that arrived since
        then as ``request`` lines, in the export before its final keyframe."""
        self.engine_facts = dict(facts)
        self._requests = requests

    def _snapshot(self) -> RuntimeKeyframe:
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
        if len(seg) >= self.forced_ops:
            # No ticks (a bench, a test), or ticks too few for the operations
            # (a mirror applying a GPU engine's steps): a keyframe before the
            # next operation (not now: the engine has not absorbed this one's
            # events yet).
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
        """Tick time: the export's size measured further (ExportSizer)."""
        self.sizer.calibrate(self.segments)

    def export_size(self) -> ExportSize:
        """What ``export_lines`` would write now, without writing it
        (ExportSizer.estimate)."""
        return self.sizer.estimate(self.segments, self.seq, self.ops, self.nbytes, self._header())

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

    def info(self) -> History:
        return History(
            enabled=True,
            first_seq=self.first_seq,
            last_seq=self.seq,
            first_ts=self.first_ts,
            last_ts=self.last_ts(),
            ops_held=self.ops,
            bytes_held=self.nbytes,
            dropped_ops=self.dropped_ops,
            dropped_segments=self.dropped_segments,
            keyframes=[{"seq": s.keyframe.seq, "ts": s.keyframe.ts} for s in self.segments],
            keyframes_taken=self.keyframes_taken,
            horizon=self.horizon(),
            keyframe_seconds_total=self.keyframe_seconds,
            limits={
                "max_ops": self.max_ops,
                "max_bytes": self.max_bytes,
                "keyframe_ops": self.keyframe_ops,
            },
        )

    # -------------------------------------------------------------- export

    def export_parts(self) -> tuple[dict[str, Any], list[Segment], RuntimeKeyframe, EventsView]:
        """On the engine's loop: what an export needs, consistent at one
        moment (the segments' lists are copied; the final keyframe is now)."""
        header = self._header()
        segs = [seg.copy() for seg in self.segments]
        final = snapshot(self.engine, self.seq, self.clock())
        return header, segs, final, EventsView(self.engine.events)

    def export_requests(self) -> Iterable[str]:
        """On the engine's loop, with ``export_parts``: a mirror's engine
        requests over the recording's span, as lines (none elsewhere)."""
        if self._requests is None:
            return ()
        return self._requests(self.first_ts)

    def _header(self) -> dict[str, Any]:
        return header_json(self.engine, self.first_seq, self.seq, self.engine_facts)
