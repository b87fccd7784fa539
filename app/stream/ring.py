"""The ring buffer of recent deltas that resuming clients are answered from.

Each entry is one tick's all-channel delta plus every variant made of it so
far (a channel subset, compressed or not): the live ones of its tick for free
(``keep_live``), any other the first time a resuming client needs it
(``variant``).  A frame is therefore compressed once however many clients
resume it, and a replayed frame is byte for byte what a live client of the
same channels got.  Variants count towards the byte bound.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from app.stream import protocol as p

RING_FRAMES = 1200
RING_BYTES = 64 * 1024 * 1024
ALL = frozenset(p.CHANNELS)
# The delta header's keys that belong to a channel (the others go to everyone).
CHANNEL_KEYS = {
    "events": ("events", "events_omitted", "events_last_seq"),
    "series": ("point",),
    "samples": ("samples", "samples_last_seq", "histograms"),
    "analysis": ("analysis",),
}
_KEY_CHANNEL = {key: ch for ch, keys in CHANNEL_KEYS.items() for key in keys}
Variant = tuple[frozenset[str], bool]  # (channels, compressed)


def select_header(header: dict[str, Any], channels: frozenset[str]) -> dict[str, Any]:
    """A delta header cut down to ``channels`` (``columns`` left out)."""
    return {
        k: v
        for k, v in header.items()
        if k != "columns" and (k not in _KEY_CHANNEL or _KEY_CHANNEL[k] in channels)
    }


def filter_delta(full: bytes, channels: frozenset[str]) -> bytes:
    """The all-channel delta ``full`` as a client of ``channels`` gets it live
    (the same bytes: JSON numbers and key order survive the round trip)."""
    if channels >= ALL:
        return full
    frame = p.decode(full)
    columns = None
    if "blocks" in channels:
        columns = {
            name: (dtype, frame.columns[name]) for name, dtype, _, _ in frame.header["columns"]
        }
    return p.encode(p.DELTA, frame.seq, select_header(frame.header, channels), columns)


@dataclass(eq=False)
class RingFrame:
    """One tick's delta and the variants made of it so far."""

    seq: int
    full: bytes
    variants: dict[Variant, bytes] = field(default_factory=dict)
    size: int = 0

    def __post_init__(self) -> None:
        self.size = len(self.full)


class Ring:
    def __init__(self, max_frames: int = RING_FRAMES, max_bytes: int = RING_BYTES) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.frames: deque[RingFrame] = deque()
        self.bytes = 0
        self.variants_made = 0  # variants encoded for resumes (not at their tick)

    def __len__(self) -> int:
        return len(self.frames)

    def append(self, seq: int, full: bytes) -> RingFrame:
        entry = RingFrame(seq, full)
        self.frames.append(entry)
        self.bytes += entry.size
        self._trim()
        return entry

    def keep_live(self, entry: RingFrame, encoded: dict[Variant, bytes]) -> None:
        """Keep the variants ``entry``'s tick made for its live clients."""
        if not self.frames or self.frames[-1] is not entry:
            return  # already trimmed away (a frame over the byte bound)
        for key, frame in encoded.items():
            if key != (ALL, False) and key not in entry.variants:
                entry.variants[key] = frame
                entry.size += len(frame)
                self.bytes += len(frame)
        self._trim()

    def span(self, from_seq: int, last_seq: int, room: int) -> list[RingFrame] | None:
        """Entries ``from_seq..last_seq`` (the ring's seqs are consecutive and
        end at ``last_seq``: found by arithmetic), or None when the ring no
        longer holds them all or there are more than ``room``."""
        count = last_seq + 1 - from_seq
        first = self.frames[0].seq if self.frames else last_seq + 1
        if count < 0 or from_seq < first or count > room:
            return None
        entries = [self.frames[-i] for i in range(count, 0, -1)]
        if entries and entries[0].seq != from_seq:  # pragma: no cover - consecutive by design
            return None
        return entries

    def variant(self, entry: RingFrame, channels: frozenset[str], compress: bool) -> bytes:
        """``entry`` for a client of ``channels`` (and compression): made once."""
        channels = channels & ALL
        if channels == ALL and not compress:
            return entry.full
        key = (channels, compress)
        frame = entry.variants.get(key)
        if frame is None:
            plain = entry.full if channels == ALL else entry.variants.get((channels, False))
            if plain is None:
                plain = self._keep(entry, (channels, False), filter_delta(entry.full, channels))
            frame = plain
            if compress:
                frame = self._keep(entry, key, p.compress_frame(plain))
            self._trim()
        return frame

    def _keep(self, entry: RingFrame, key: Variant, frame: bytes) -> bytes:
        entry.variants[key] = frame
        entry.size += len(frame)
        self.bytes += len(frame)
        self.variants_made += 1
        return frame

    def _trim(self) -> None:
        while self.frames and (len(self.frames) > self.max_frames or self.bytes > self.max_bytes):
            self.bytes -= self.frames.popleft().size
