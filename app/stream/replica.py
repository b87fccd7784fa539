"""PoolReplica: applies stream frames and keeps an exact copy of the pool.

Pure (no I/O): the reference for the browser code and what the Python client
uses.  After a snapshot at seq S it accepts deltas S+1, S+2, ... in order; a
delta with another seq raises FrameGap, and the caller resumes from
``replica.next_seq`` (or asks for a snapshot).
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

import numpy as np

from app.stream import protocol as p

FREE_STATES = (2, 3)


class FrameGap(Exception):
    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"expected frame {expected}, got {got}")
        self.expected = expected
        self.got = got


class PoolReplica:
    def __init__(self, keep_events: int = 10_000) -> None:
        self.config: dict[str, Any] | None = None
        # the block columns the config frame names (until one came: the protocol's)
        self.block_columns = [name for name, _ in p.BLOCK_COLUMNS]
        self.epoch: str | None = None
        self.seq: int | None = None  # last applied frame (None: no snapshot yet)
        self.state = np.zeros(0, dtype=np.uint8)
        self.ref_cnt = np.zeros(0, dtype=np.int32)
        self.hashed = np.zeros(0, dtype=np.uint8)
        self.hash64 = np.zeros(0, dtype=np.uint64)
        self.group = np.zeros(0, dtype=np.uint32)
        self.stamp = np.zeros(0, dtype=np.float64)
        self.header: dict[str, Any] = {}
        self.events: deque[list[Any]] = deque(maxlen=keep_events)
        self.points: deque[dict[str, Any]] = deque(maxlen=6000)
        self.snapshots = 0
        self.deltas = 0
        self.events_omitted = 0

    @property
    def next_seq(self) -> int | None:
        return None if self.seq is None else self.seq + 1

    def apply(self, frame: p.Frame) -> None:
        if frame.kind == p.CONFIG:
            epoch = frame.header.get("epoch")
            if self.epoch is not None and epoch != self.epoch:
                self.seq = None  # another server: wait for its snapshot
            self.epoch = epoch
            self.config = frame.header.get("config")
            self.block_columns = [name for name, _ in frame.header["block_columns"]]
        elif frame.kind == p.SNAPSHOT:
            missing = [name for name in self.block_columns if name not in frame.columns]
            if missing:
                raise p.FrameError(f"the snapshot lacks the columns {missing}")
            for name in self.block_columns:
                setattr(self, name, frame.columns[name])
            self.header = frame.header
            self.seq = frame.seq
            self.events.clear()
            self.events.extend(frame.header.get("recent_events", []))
            self.points.clear()
            self.points.extend(frame.header.get("series", []))
            self.snapshots += 1
        elif frame.kind == p.DELTA:
            if self.seq is None:
                return  # waiting for a snapshot
            if frame.seq <= self.seq:
                return  # already applied (a resumed range overlaps)
            if frame.seq != self.seq + 1:
                raise FrameGap(self.seq + 1, frame.seq)
            c = frame.columns
            if "ids" in c:
                ids = c["ids"].astype(np.int64)
                for name in self.block_columns:
                    getattr(self, name)[ids] = c[name]
            h = frame.header
            self.header = {**self.header, **{k: v for k, v in h.items() if k != "columns"}}
            self.events.extend(h.get("events", []))
            self.events_omitted += h.get("events_omitted", 0)
            if h.get("point") is not None:
                self.points.append(h["point"])
            self.seq = frame.seq
            self.deltas += 1

    # ------------------------------------------------------------- views

    def queue_order(self) -> list[int]:
        """Free block ids from head (next to be evicted) to tail."""
        free = np.flatnonzero(np.isin(self.state, FREE_STATES))
        order: list[int] = free[np.argsort(self.stamp[free], kind="stable")].tolist()
        return order

    def hash_map(self) -> dict[tuple[int, int], list[int]]:
        """(64-bit hash, group) -> sorted block ids holding it."""
        out: dict[tuple[int, int], list[int]] = defaultdict(list)
        for bid in np.flatnonzero(self.hashed).tolist():
            out[(int(self.hash64[bid]), int(self.group[bid]))].append(bid)
        return dict(out)

    def counts(self) -> dict[str, int]:
        c = np.bincount(self.state, minlength=4)
        return {"null": int(c[0]), "in_use": int(c[1]), "cached": int(c[2]), "empty": int(c[3])}
