"""StreamHub: encode each tick once, fan it out without ever awaiting a client.

The engine calls ``on_tick`` (synchronously) once per tick.  The hub encodes
one delta frame per distinct channel set, keeps the full frames in a ring
buffer for resuming clients, and puts the bytes on each client's small
bounded queue with ``put_nowait``.  A client whose queue is full loses its
queue and is marked "needs snapshot": at the next tick it gets a fresh
snapshot instead of a delta.  Drops and resyncs are counted.
A resume is answered from the ring (``ring.py``): one cached lookup per
replayed frame, whatever the number of clients or requests.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from app.shared.auth import TicketBook
from app.stream import protocol as p
from app.stream.ring import ALL, Ring, Variant, select_header
from app.web.broadcast import BroadcastCounts, Broadcaster, Subscriber
from blockpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from blockpool.common.figures import Figures, counter, helps, totals
from blockpool.common.keys import hash_hex, hex64_all

if TYPE_CHECKING:
    from app.pool.engine import Engine, TickData
    from app.stream.intake import TokenBucket

QUEUE_FRAMES = 32
MAX_EVENTS_PER_FRAME = 4000
RECENT_EVENTS = 500
RECENT_POINTS = 1200
# a mirror service's ``mirror`` header: the newest engine batch applied (None: none yet)
MirrorHeader = Callable[[], dict[str, Any] | None]
ANALYSIS_EVERY_S = 1.0  # the analysis section rides in at most one delta a second


def _hexes(hashes: list[Any]) -> list[str]:
    """``hash_hex`` of each (an event's hashes are all ints or all bytes)."""
    if hashes and isinstance(hashes[0], int):
        return hex64_all(hashes)
    return [h.hex() for h in hashes]


def compact_event(seq: int, ev: KVCacheEvent) -> list[Any]:
    """[seq, type, ...] — see docs/protocol.md."""
    if isinstance(ev, BlockRemoved):
        return [seq, p.EV_REMOVED, _hexes(ev.block_hashes)]
    if isinstance(ev, BlockStored):
        return [
            seq,
            p.EV_STORED,
            _hexes(ev.block_hashes),
            None if ev.parent_block_hash is None else hash_hex(ev.parent_block_hash),
            len(ev.token_ids),
            ev.block_size,
            ev.lora_name,
        ]
    if isinstance(ev, AllBlocksCleared):
        return [seq, p.EV_CLEARED]
    return [seq, -1]


def compact_events(items: list[tuple[int, float, KVCacheEvent]]) -> list[list[Any]]:
    """``compact_event`` of each (seq, ts, event): a tick's events, at a GPU
    engine's rate mostly evictions of one int hash each (~100k a second),
    which take a path of their own -- the same list, without the calls
    ``compact_event`` makes for it."""
    out: list[list[Any]] = []
    add = out.append
    ev_removed = p.EV_REMOVED
    for seq, _, ev in items:
        if isinstance(ev, BlockRemoved):
            hs = ev.block_hashes
            if len(hs) == 1 and hs[0].__class__ is int:
                add([seq, ev_removed, [f"{hs[0]:016x}"]])  # (hex64, inlined)
                continue
        add(compact_event(seq, ev))
    return out


def _frame_seq(frame: bytes) -> int:
    return int.from_bytes(frame[8:16], "little")


def _finite(d: dict[str, float]) -> dict[str, float | None]:
    return {k: (v if np.isfinite(v) else None) for k, v in d.items()}


@dataclass(eq=False, kw_only=True)
class Client(Subscriber[bytes]):
    """A stream client: its channels, compression and request budget."""

    queue_size: int = QUEUE_FRAMES
    channels: frozenset[str]
    compress: bool = False
    bucket: TokenBucket | None = None  # resumes and snapshots it may still ask for
    refused: deque[float] = field(default_factory=deque)  # when its last messages were refused


@dataclass
class StreamCounters(BroadcastCounts):
    snapshots: int = counter("Snapshot frames encoded.")
    resumes: int = counter("Resumes answered from the ring of recent frames.")


STREAM_HELP = {
    **helps(StreamCounters),
    "clients": "Stream clients connected.",
    "ring_variants_made_total": "Channel / compression variants of ring frames encoded.",
    "max_lag_frames": "Frames the slowest client is behind the newest.",
}


class StreamHub:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seq = 0
        self.ring = Ring()
        self.counts = StreamCounters()
        self.fan: Broadcaster[bytes] = Broadcaster(self.counts, _frame_seq)
        self.figures = Figures(self.metrics, STREAM_HELP)
        self.tickets = TicketBook()
        self.recent_events: deque[list[Any]] = deque(maxlen=RECENT_EVENTS)
        self.epoch = f"{time.time():.6f}"  # a new server = a new epoch
        self._analysis_at = 0.0
        # a mirror service's source of the newest applied batch (the ``mirror`` header)
        self._mirror_header: MirrorHeader | None = None
        engine.listeners.append(self.on_tick)

    def follow_mirror(self, header: MirrorHeader) -> None:
        """A mirror service: every frame's counts carry ``header()`` (the
        newest engine batch applied; None: none yet) as ``mirror``."""
        self._mirror_header = header

    def mirror_now(self) -> Any:
        """What the next frame's ``mirror`` header will say (None: no mirror)."""
        return self._mirror_header() if self._mirror_header is not None else None

    # ------------------------------------------------------------- clients

    @property
    def clients(self) -> set[Subscriber[bytes]]:
        return self.fan.subscribers

    def connect(
        self, channels: frozenset[str], resume_from: int | None, compress: bool = False
    ) -> Client:
        client = Client(channels=channels, compress=compress)
        client.queue.put_nowait(self._for(client, self.config_frame()))
        if resume_from is not None and self.resume(client, resume_from):
            client.needs_resync = False
        self.fan.add(client)
        return client

    def disconnect(self, client: Client) -> None:
        self.fan.remove(client)

    def resume(self, client: Client, from_seq: int) -> bool:
        """Queue frames ``from_seq``.. from the ring; False (snapshot needed)
        when the ring no longer holds them all or they would not fit."""
        entries = self.ring.span(from_seq, self.seq, QUEUE_FRAMES - client.queue.qsize())
        if entries is None:
            return False
        for entry in entries:
            client.queue.put_nowait(self.ring.variant(entry, client.channels, client.compress))
        self.counts.resumes += 1
        return True

    def request_snapshot(self, client: Client) -> None:
        """A snapshot at the next tick instead of what it has queued."""
        self.fan.resync(client)

    @staticmethod
    def _for(client: Client, frame: bytes) -> bytes:
        return p.compress_frame(frame) if client.compress else frame

    # -------------------------------------------------------------- frames

    def config_frame(self) -> bytes:
        from app.pool.views import summary as views

        header = {
            "protocol": p.VERSION,
            "epoch": self.epoch,
            "seq": self.seq,
            "config": views.config(self.engine).model_dump(exclude_unset=True),
            "channels": list(p.CHANNELS),
            "block_columns": [list(c) for c in p.BLOCK_COLUMNS],
        }
        return p.encode(p.CONFIG, self.seq, header)

    def _counts(self) -> dict[str, Any]:
        from app.pool.views import summary as views

        tokens = views.tokens(self.engine).model_dump(exclude_unset=True)
        counts = {**views.headline(self.engine), "tokens": tokens}
        mirror = self.mirror_now()
        if mirror is not None:
            counts["mirror"] = mirror
        return counts

    def snapshot_frame(self) -> bytes:
        e = self.engine
        cols = e.columns
        header: dict[str, Any] = {
            "as_of": self.seq,
            "next_stamp": cols.next_stamp,
            "events_last_seq": e.events.last_seq,
            "samples_last_seq": e.samples.last_seq,
            "recent_events": list(self.recent_events),
            "series": [_finite(pt) for pt in list(e.series)[-RECENT_POINTS:]],
            "histograms": self._histograms(),
            "stream": self.stats(),
            **self._counts(),
        }
        # whether the analysis runs: its section may not exist yet (an idle
        # server, a worker that has not reported)
        header["analysis_enabled"] = e.analysis is not None
        section = e.analysis.stream_section() if e.analysis is not None else None
        if section is not None:
            header["analysis"] = section
        columns = p.block_rows(cols)
        self.counts.snapshots += 1
        return p.encode(p.SNAPSHOT, self.seq, header, columns)

    def _histograms(self) -> dict[str, Any]:
        return {
            name: {
                "buckets": list(h.buckets),
                "counts": list(h.counts),
                "sum": h.sum,
                "count": h.count,
            }
            for name, h in self.engine.histograms.items()
        }

    def _delta_header(self, data: TickData, parts: dict[str, Any]) -> dict[str, Any]:
        """The all-channel delta header (``select_header`` cuts it down)."""
        header: dict[str, Any] = {"tick": data.tick, "ts": data.ts, "stream": parts["stream"]}
        header.update(parts["counts"])
        header.update(parts["events"])
        header["point"] = parts["point"]
        header.update(parts["samples"])
        if parts.get("analysis") is not None:
            header["analysis"] = parts["analysis"]
        return header

    def _delta(
        self, header: dict[str, Any], channels: frozenset[str], parts: dict[str, Any]
    ) -> bytes:
        columns = parts["columns"] if "blocks" in channels else None
        return p.encode(p.DELTA, self.seq, select_header(header, channels), columns)

    # ---------------------------------------------------------------- tick

    def on_tick(self, data: TickData) -> None:
        """Engine context: encode once, fan out with put_nowait only."""
        self.seq += 1
        e = self.engine
        events = compact_events(data.events)
        self.recent_events.extend(events[-RECENT_EVENTS:])
        omitted = max(0, len(events) - MAX_EVENTS_PER_FRAME)
        ids = data.dirty
        cols = e.columns
        parts: dict[str, Any] = {
            "stream": self.stats(),
            "counts": self._counts(),
            "point": _finite(data.point),
            "events": {
                "events": events[omitted:],
                # not sent: over the per-frame cap, or gone from the
                # engine's bounded log before this tick (data.events_lost)
                "events_omitted": omitted + data.events_lost,
                "events_last_seq": e.events.last_seq,
            },
            "samples": {
                "samples": [
                    [seq, s.lifetime_seconds, s.idle_seconds, list(s.reuse_gaps_seconds)]
                    for seq, _, s in data.samples
                ],
                "samples_last_seq": e.samples.last_seq,
                "histograms": self._histograms() if data.samples else None,
            },
            "columns": {"ids": ("u32", ids), **p.block_rows(cols, ids)},
            "analysis": None,
        }
        if e.analysis is not None and data.ts - self._analysis_at >= ANALYSIS_EVERY_S:
            self._analysis_at = data.ts
            parts["analysis"] = e.analysis.stream_section()
        header = self._delta_header(data, parts)
        full = self._delta(header, ALL, parts)
        entry = self.ring.append(self.seq, full)
        if not self.fan:
            return
        if data.full:
            for sub in self.fan:
                sub.clear()
                sub.needs_resync = True
        # Each variant (channel set, compressed or not) is encoded once.
        encoded: dict[Variant, bytes] = {(ALL, False): full}
        snapshots: dict[bool, bytes] = {}
        for sub in self.fan:
            assert isinstance(sub, Client)
            client = sub
            if client.needs_resync:
                if client.sending:
                    continue  # stalled in a send: no snapshot until it is free
                if False not in snapshots:
                    snapshots[False] = self.snapshot_frame()
                if client.compress and True not in snapshots:
                    snapshots[True] = p.compress_frame(snapshots[False])
                frame = snapshots[client.compress]
            else:
                key = (client.channels, client.compress)
                cached = encoded.get(key)
                if cached is None:
                    plain = encoded.get((client.channels, False))
                    if plain is None:
                        plain = encoded[(client.channels, False)] = self._delta(
                            header, client.channels, parts
                        )
                    cached = encoded[key] = p.compress_frame(plain) if client.compress else plain
                frame = cached
            # too slow (its queue full): dropped, it gets a snapshot next tick
            if self.fan.offer(client, frame):
                client.needs_resync = False
        self.ring.keep_live(entry, encoded)  # a resume needing one of them is free

    # --------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        lag = self.fan.max_lag(self.seq)
        return {
            "seq": self.seq,
            "clients": len(self.fan),
            **totals(self.counts),
            "max_lag_frames": lag,
            "ring_frames": len(self.ring),
        }

    def metrics(self) -> dict[str, float]:
        s = self.stats()
        return {
            "clients": float(s["clients"]),
            **{k: float(v) for k, v in totals(self.counts).items()},
            "ring_variants_made_total": float(self.ring.variants_made),
            "max_lag_frames": float(s["max_lag_frames"]),
        }
