"""A recording's storage: one entry per operation (its encoded fields and
result, its events found again by seq), kept per segment in columns.

An entry is ``(seq, time, blob, first event seq, event count)``; the blob is
the msgpack of (op class name, op fields, ok, result or error body).  A
``Segment`` is a keyframe and the entries after it, as columns: one bytes
object per operation, the rest in arrays (nothing per operation for the
garbage collector to track).  ``EventsView`` finds an entry's events in a
copy of the engine's event log.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from blockpool import KVCacheEvent
from blockpool.runtime.ops import op_from_fields
from blockpool.runtime.seqlog import SeqLog
from blockpool.runtime.state import RuntimeKeyframe

# seq, ts, msgpack of (op class name, op fields, ok, result or error body),
# the engine event-log seq of its first event, how many events it emitted
Entry = tuple[int, float, bytes, int, int]
encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(tuple[str, dict[str, Any], bool, Any]).decode


def unpack(entry: Entry) -> tuple[int, float, Any, bool, Any]:
    """(seq, ts, op model, ok, result or error body) of one entry."""
    seq, ts, blob, _, _ = entry
    name, fields, ok, payload = _decode(blob)
    return seq, ts, op_from_fields(name, fields), ok, payload


def decode_op(blob: bytes) -> tuple[Any, bool]:
    """(op model, whether it succeeded) of an encoded operation."""
    name, fields, ok, _ = _decode(blob)
    return op_from_fields(name, fields), ok


class EventsView:
    """A copy of the engine's event log (taken between operations) to find
    recorded operations' events by seq."""

    def __init__(self, log: SeqLog[KVCacheEvent]) -> None:
        items = list(log._items)
        self.first = items[0][0] if items else log.last_seq + 1
        self.events = [ev for _, _, ev in items]

    def of(self, entry: Entry) -> list[KVCacheEvent] | None:
        """The entry's events, or None when the log no longer holds them all."""
        first, n = entry[3], entry[4]
        if not n:
            return []
        i = first - self.first
        if i < 0 or i + n > len(self.events):
            return None
        return self.events[i : i + n]


KINDS = 3  # events by kind: BlockStored, BlockRemoved, any other


@dataclass(slots=True)
class Sample:
    """A segment's export lines, measured in part: its operations' lines
    (without their events) sampled, each weighted by the operations it
    stands for; its events counted exactly (by kind, token ids, hashes) as
    the operations are covered, and some of them written."""

    upto: int = 0  # operations 0 .. upto - 1 are covered
    line_bytes: float = 0.0  # weighted: sampled lines with no events
    pack_bytes: float = 0.0  # weighted: their recorded bytes
    events: int = 0  # of the covered operations, held by the event log then
    ops_with_events: int = 0
    kinds: list[int] = field(default_factory=lambda: [0] * KINDS)
    tokens: int = 0
    hashes: int = 0
    # weighted, of the events written: their bytes less the lists, by kind;
    # the token and hash lists' bytes less brackets, and their lengths
    rest_bytes: list[float] = field(default_factory=lambda: [0.0] * KINDS)
    rest_n: list[float] = field(default_factory=lambda: [0.0] * KINDS)
    token_bytes: float = 0.0
    token_n: float = 0.0
    hash_bytes: float = 0.0
    hash_n: float = 0.0

    def copy(self) -> Sample:
        return replace(
            self, kinds=list(self.kinds), rest_bytes=list(self.rest_bytes), rest_n=list(self.rest_n)
        )


class Segment:
    """A keyframe and the operations after it, as columns: one bytes object
    per operation, the rest in arrays (nothing per operation for the
    garbage collector to track)."""

    __slots__ = (
        "blobs",
        "ev_first",
        "ev_n",
        "json_bytes",
        "keyframe",
        "nbytes",
        "sample",
        "ts",
    )

    def __init__(self, keyframe: RuntimeKeyframe) -> None:
        self.keyframe = keyframe
        self.blobs: list[bytes] = []
        self.ts = array("d")
        self.ev_first = array("q")
        self.ev_n = array("q")
        self.nbytes = 0
        self.json_bytes = 0  # its keyframe's export line, once measured
        self.sample = Sample()  # some of its operations' export lines, measured

    def __len__(self) -> int:
        return len(self.blobs)

    def entries(self, lo: int = 0, hi: int | None = None) -> list[Entry]:
        """Operations ``lo .. hi - 1`` of the segment (seq = keyframe seq + 1 + i)."""
        hi = len(self.blobs) if hi is None else min(hi, len(self.blobs))
        base = self.keyframe.seq + 1
        b, t, f, n = self.blobs, self.ts, self.ev_first, self.ev_n
        return [(base + i, t[i], b[i], f[i], n[i]) for i in range(max(0, lo), hi)]

    def copy(self) -> Segment:
        other = Segment(self.keyframe)
        other.blobs = list(self.blobs)
        other.ts = array("d", self.ts)
        other.ev_first = array("q", self.ev_first)
        other.ev_n = array("q", self.ev_n)
        other.nbytes = self.nbytes
        other.json_bytes = self.json_bytes
        other.sample = self.sample.copy()
        return other
