"""The recording: every operation the engine applied, with its result and
events, in segments that each start with a keyframe.

On the hot path ``record`` encodes the validated op's fields, its result or
error and the events it emitted into one msgpack blob (msgspec, in C: ~0.4 us
for a decode step, ~3.5 us for a 700-token admission) and keeps
``(seq, time, blob)``.  Keeping the op models, result dicts and event lists
themselves would cost far more: every retained container is traversed by the
garbage collector again and again (measured: -20% engine throughput), and a
token id as a Python int takes 36 bytes against ~3 in msgpack.

At tick time, once the current segment holds ``keyframe_ops`` operations, a
keyframe closes it (an O(blocks) snapshot between two operations).  The
recording is bounded by operations and by encoded bytes: when over either
bound the oldest segment goes, so the recording always starts at a keyframe.

The state at any recorded moment is its segment's keyframe plus the
operations up to that moment, replayed into a fresh engine (``replay.py``).
Export writes JSON lines: a header (the pool's settings), then every
keyframe and operation in order, then a ``final`` keyframe of the state at
export time; ``replay.replay_file`` replays such a file and checks it.
"""

from __future__ import annotations

import bisect
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from app import schemas
from app.analysis.state import Keyframe, keyframe_json, snapshot
from blockpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from blockpool.events import AnyKVEvent

if TYPE_CHECKING:
    from app.engine import Engine

FORMAT = "blockpool-recording"
VERSION = 1
# Settings that shape the pool (the header keeps them; never the token).
POOL_SETTINGS = (
    "num_blocks",
    "block_size",
    "num_groups",
    "hash_fn",
    "hash_seed",
    "enable_caching",
    "enable_events",
    "metrics_sample_rate",
    "metrics_seed",
    "max_ids_per_call",
    "max_tokens_per_request",
    "max_requests",
)

# seq, ts, msgpack of (op class name, op fields, ok, result or error body, events)
Entry = tuple[int, float, bytes]
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(tuple[str, dict[str, Any], bool, Any, list[AnyKVEvent]]).decode
OP_CLASSES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        schemas.AllocateOp,
        schemas.FreeOp,
        schemas.TouchOp,
        schemas.CacheOp,
        schemas.LookupOp,
        schemas.PrefixLookupOp,
        schemas.EvictOp,
        schemas.ResetOp,
        schemas.AdmitOp,
        schemas.AppendOp,
        schemas.FinishOp,
    )
}


def unpack(entry: Entry) -> tuple[int, float, Any, bool, Any, list[KVCacheEvent]]:
    """(seq, ts, op model, ok, result or error body, events) of one entry."""
    seq, ts, blob = entry
    name, fields, ok, payload, events = _decode(blob)
    return seq, ts, OP_CLASSES[name].model_construct(**fields), ok, payload, list(events)


@dataclass
class Segment:
    keyframe: Keyframe
    entries: list[Entry] = field(default_factory=list)
    nbytes: int = 0


class Recorder:
    def __init__(
        self,
        engine: Engine,
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
        self.keyframe_seconds = 0.0
        self.segments: deque[Segment] = deque()
        self.segments.append(Segment(self._snapshot()))

    def _snapshot(self) -> Keyframe:
        t0 = time.perf_counter()
        kf = snapshot(self.engine, self.seq, self.clock())
        self.keyframes_taken += 1
        self.keyframe_seconds += time.perf_counter() - t0
        return kf

    # ----------------------------------------------------------- hot path

    def record(self, op: Any, ok: bool, payload: Any, events: list[KVCacheEvent]) -> None:
        self.seq += 1
        seg = self.segments[-1]
        blob = _encode((op.__class__.__name__, op.__dict__, ok, payload, events))
        seg.entries.append((self.seq, self.clock(), blob))
        n = len(blob)
        seg.nbytes += n
        self.nbytes += n
        self.ops += 1
        if len(seg.entries) >= 2 * self.keyframe_ops:
            # No ticks (a bench, a test): a keyframe before the next operation
            # (not now: the engine has not absorbed this one's events yet).
            self.due = True
        elif self.ops > self.max_ops or self.nbytes > self.max_bytes:
            self._enforce()

    # ----------------------------------------------------------- tick time

    def maybe_keyframe(self) -> None:
        if len(self.segments[-1].entries) >= self.keyframe_ops:
            self.keyframe()

    def keyframe(self) -> None:
        """Between operations only (tick time, or before the next one)."""
        self.due = False
        self.segments.append(Segment(self._snapshot()))
        self._enforce()

    def _enforce(self) -> None:
        segs = self.segments
        while len(segs) > 1 and (self.ops > self.max_ops or self.nbytes > self.max_bytes):
            old = segs.popleft()
            self.ops -= len(old.entries)
            self.nbytes -= old.nbytes
            self.dropped_ops += len(old.entries)
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
        return seg.entries[-1][1] if seg.entries else seg.keyframe.ts

    def seq_at(self, ts: float) -> int:
        """The last op seq applied at or before ``ts`` (the first keyframe's
        seq when ``ts`` is before every op held)."""
        best = self.first_seq
        for seg in self.segments:
            if seg.keyframe.ts > ts:
                break
            best = seg.keyframe.seq
            ents = seg.entries
            i = bisect.bisect_right([e[1] for e in ents], ts)
            if i:
                best = ents[i - 1][0]
        return best

    def ts_of(self, seq: int) -> float:
        seg = self.segment_for(seq)
        if seg is None:
            return float("nan")
        if seq == seg.keyframe.seq:
            return seg.keyframe.ts
        return seg.entries[seq - seg.keyframe.seq - 1][1]

    def segment_for(self, seq: int) -> Segment | None:
        """The segment whose keyframe is the last at or before ``seq``."""
        if seq < self.first_seq or seq > self.seq:
            return None
        seqs = [s.keyframe.seq for s in self.segments]
        return self.segments[bisect.bisect_right(seqs, seq) - 1]

    def entries_between(self, after: int, upto: int) -> list[Entry]:
        """Entries with ``after < seq <= upto`` (held ones)."""
        out: list[Entry] = []
        for seg in self.segments:
            ents = seg.entries
            if not ents or ents[-1][0] <= after or seg.keyframe.seq >= upto:
                continue
            lo = max(0, after - seg.keyframe.seq)
            hi = max(0, upto - seg.keyframe.seq)
            out.extend(ents[lo:hi])
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
            "keyframe_seconds_total": self.keyframe_seconds,
            "limits": {
                "max_ops": self.max_ops,
                "max_bytes": self.max_bytes,
                "keyframe_ops": self.keyframe_ops,
            },
        }

    # -------------------------------------------------------------- export

    def export_parts(self) -> tuple[dict[str, Any], list[Segment], Keyframe]:
        """On the engine's loop: what an export needs, consistent at one
        moment (the segments' lists are copied; the final keyframe is now)."""
        s = self.engine.settings
        header = {
            "type": "header",
            "format": FORMAT,
            "version": VERSION,
            "created": time.time(),
            "settings": {
                **{k: getattr(s, k) for k in POOL_SETTINGS},
                "num_blocks": self.engine.pool.num_gpu_blocks,
            },
            "first_seq": self.first_seq,
            "last_seq": self.seq,
        }
        segs = [Segment(seg.keyframe, list(seg.entries), seg.nbytes) for seg in self.segments]
        final = snapshot(self.engine, self.seq, self.clock())
        return header, segs, final


def entry_json(entry: Entry) -> dict[str, Any]:
    seq, ts, op, ok, payload, events = unpack(entry)
    return {
        "type": "op",
        "seq": seq,
        "ts": ts,
        "op": op.model_dump(mode="json"),
        "ok": ok,
        "result" if ok else "error": payload,
        "events": [event_to_json(ev) for ev in events],
    }


def export_lines(header: dict[str, Any], segments: list[Segment], final: Keyframe) -> Iterator[str]:
    """JSON lines (each ends with a newline)."""
    dumps = json.dumps
    yield dumps(header) + "\n"
    for seg in segments:
        yield dumps({"type": "keyframe", **keyframe_json(seg.keyframe)}) + "\n"
        for entry in seg.entries:
            yield dumps(entry_json(entry)) + "\n"
    yield dumps({"type": "final", **keyframe_json(final)}) + "\n"


# ----------------------------------------------------------------- events


def _hash_json(h: int | bytes) -> int | str:
    return h if isinstance(h, int) else h.hex()


def _hash_from(v: int | str) -> int | bytes:
    return v if isinstance(v, int) else bytes.fromhex(v)


def event_to_json(ev: KVCacheEvent) -> dict[str, Any]:
    """Lossless (hashes stay ints, or hex for raw digests)."""
    if isinstance(ev, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": [_hash_json(h) for h in ev.block_hashes],
            "parent_block_hash": None
            if ev.parent_block_hash is None
            else _hash_json(ev.parent_block_hash),
            "token_ids": ev.token_ids,
            "block_size": ev.block_size,
            "lora_id": ev.lora_id,
            "medium": ev.medium,
            "lora_name": ev.lora_name,
        }
    if isinstance(ev, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": [_hash_json(h) for h in ev.block_hashes],
            "medium": ev.medium,
        }
    return {"type": type(ev).__name__}


def event_from_json(d: dict[str, Any]) -> KVCacheEvent:
    kind = d["type"]
    if kind == "BlockStored":
        parent = d["parent_block_hash"]
        return BlockStored(
            [_hash_from(h) for h in d["block_hashes"]],
            None if parent is None else _hash_from(parent),
            list(d["token_ids"]),
            d["block_size"],
            d["lora_id"],
            d["medium"],
            d["lora_name"],
        )
    if kind == "BlockRemoved":
        return BlockRemoved([_hash_from(h) for h in d["block_hashes"]], d["medium"])
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown event type {kind!r}")
