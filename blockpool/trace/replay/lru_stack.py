"""The LRU stack ``G`` that a group of capacities shares in a one-pass
hit-rate curve (blockpool/trace/replay/curve.py): its per-capacity columns,
its copy when capacities part, and a boundary's walk up over live entries.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

BIG = 1 << 62  # an unbounded capacity's usable blocks: its never-used blocks never run out

IntArray = npt.NDArray[np.int64]
ByteArray = npt.NDArray[np.uint8]
BoolArray = npt.NDArray[np.bool_]


class SharedStack:
    """One LRU stack ``G`` shared by a group of capacities (numpy columns:
    the per-request work is a few array operations, not a loop per block).

    The per-capacity columns (``caps``, ``usable``, ``bound``, ``empties``,
    ``hits``, ``last``) are lists in the same order.  Positions in ``G`` are
    the same in every stack (a request refused by a stack leaves its
    positions empty there), and only the first stack -- the one holding the
    largest capacity -- keeps the key -> position map.  Another stack sees a
    key where the first one does, except where the first one last stored it
    in a request this stack refused: ``regions`` holds those requests'
    positions and where this stack had their keys; ``stored`` says which
    keys it ever stored."""

    __slots__ = (
        "acc",
        "bound",
        "caps",
        "empties",
        "extra",
        "hits",
        "last",
        "least",
        "live",
        "multi",
        "parts",
        "regions",
        "stored",
        "usable",
    )

    def __init__(self, caps: list[int], usable: list[int], num_keys: int, length: int) -> None:
        self.caps = caps  # result indices
        self.usable = usable  # usable blocks (BIG: unbounded)
        self.bound = [0] * len(caps)  # the queue's head in G, per capacity
        self.empties = list(usable)  # hashless blocks in the queue (never used, or partial)
        self.hits = [0] * len(caps)  # hit blocks, per capacity
        self.last = [0] * len(caps)  # cached blocks holding the last token, per capacity
        self.live: BoolArray = np.zeros(length, dtype=np.bool_)  # entries not moved up
        self.parts: list[int] = []  # positions of the unhashed entries, rising (never moved)
        self.multi: ByteArray = np.zeros(num_keys, dtype=np.uint8)  # key -> 1: in ``extra``
        self.extra: dict[int, list[int]] = {}  # key -> copies' positions, first stored first
        # (start, end, highest full block's position, this stack's positions of its keys)
        # of the refused requests whose positions are still above a boundary
        self.regions: list[tuple[int, int, int, IntArray]] = []
        self.stored: BoolArray | None = None  # None: the first stack (its map says)
        # admitted, partial tail blocks, cold blocks, stored blocks seen: the same
        # for every capacity of the stack (added to their results at the end)
        self.acc = [0, 0, 0, 0]
        self.least = min(usable, default=BIG)  # refusals start below this many blocks

    def split(self, take: set[int], pos: IntArray) -> SharedStack:
        """A copy of the stack for the capacities (result indices) in ``take``,
        which leave this one (``pos``: the first stack's map)."""
        other = SharedStack.__new__(SharedStack)
        idx = [i for i, c in enumerate(self.caps) if c in take]
        rest = [i for i, c in enumerate(self.caps) if c not in take]
        for name in ("caps", "usable", "bound", "empties", "hits", "last"):
            col = getattr(self, name)
            setattr(other, name, [col[i] for i in idx])
            setattr(self, name, [col[i] for i in rest])
        other.live = self.live.copy()
        other.parts = list(self.parts)
        other.multi = self.multi.copy()
        other.extra = {k: list(v) for k, v in self.extra.items()}
        other.regions = list(self.regions)
        other.stored = pos >= 0 if self.stored is None else self.stored.copy()
        other.acc = list(self.acc)
        other.least = min(other.usable, default=BIG)
        self.least = min(self.usable, default=BIG)
        return other

    def true_olds(self, olds: IntArray) -> IntArray:
        """This stack's positions of a chain's keys, from the first stack's
        (exact at and above every boundary here; below, only below)."""
        regions = self.regions
        if not regions or not len(olds) or int(olds[0]) < regions[0][0]:
            return olds
        olds = olds.copy()
        for start, end, hi, theirs in reversed(regions):  # newest first: they point older
            inside = (olds >= start) & (olds < end)
            if inside.any():
                olds[inside] = theirs[hi - olds[inside]]
        return olds

    def prune(self) -> None:
        """Forget what no boundary can see any more: refused requests' positions
        below every boundary, keys with at most one copy above every boundary."""
        low = min(self.bound, default=0)
        regions = self.regions
        while regions and regions[0][1] <= low:
            regions.pop(0)
        if low and self.extra:
            multi = self.multi
            for key, copies in list(self.extra.items()):
                if sum(p >= low for p in copies) <= 1:
                    del self.extra[key]
                    multi[key] = 0


def advance_boundary(live: BoolArray, b: int, x: int) -> int:
    """Skip ``x`` live entries from ``b`` upward: the new boundary (the
    entries at and above the stack's top are all dead).  A boundary anywhere
    after the ``x``-th live entry and up to the next one is the same queue."""
    for _ in range(3):  # counting is cheaper than finding, while the gaps are few
        c = int(np.count_nonzero(live[b : b + x]))
        b += x
        x -= c
        if not x:
            return b
    w = 2 * x if x > 32 else 64
    while True:
        idx = live[b : b + w].nonzero()[0]
        if len(idx) >= x:
            return b + int(idx[x - 1]) + 1
        if b + w >= len(live):
            raise AssertionError("boundary ran past the stack's top")
        x -= len(idx)
        b += w
        w *= 2
