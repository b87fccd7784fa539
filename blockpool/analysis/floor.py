"""The floor index: for each physical block, what followed it in the last
request that stored it or went through it.

A prompt that diverges from that request inside the next block shares
1..block_size-1 leading tokens that cannot hit (``block_size_floor`` in
``misses.py``).  Per physical block: the record of that request and which of
its blocks it was; a record holds the request's token list by reference
(decode tokens count, its partial tail too), and records are bounded by
count and by tokens held.  For a prompt's first block: the last first block
stored under the same extra keys (``root_latest``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from blockpool.common.miss_reasons import Tag


class FloorIndex:
    """Physical block -> (record, block index in its request); the records."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.bs = block_size
        n = num_blocks
        self.cont_rec = np.full(n, -1, dtype=np.int64)
        self.cont_pos = np.zeros(n, dtype=np.int64)
        self.recs: OrderedDict[int, tuple[list[int], str]] = OrderedDict()
        self.rec_tokens = 0
        self.recs_max = max(1024, 2 * n)
        self.rec_tokens_max = max(1 << 18, 16 * n)
        self.next_rec = 0
        self.root_latest: dict[Tag, tuple[tuple[int, ...], str]] = {}  # first blocks per keys

    def shared(self, cand: Sequence[int], tokens: list[int], start: int) -> int:
        """Leading tokens ``cand`` shares with ``tokens[start:]``."""
        n = min(len(cand), len(tokens) - start)
        k = 0
        while k < n and cand[k] == tokens[start + k]:
            k += 1
        return k

    def set_cont(self, ids: list[int], rec: int, lo: int) -> None:
        """Blocks ``lo ..`` of record ``rec``'s request sit in ``ids``."""
        if len(ids) > 8:
            idx = np.array(ids, dtype=np.int64)
            self.cont_rec[idx] = rec
            self.cont_pos[idx] = np.arange(lo, lo + len(ids), dtype=np.int64)
        else:
            cr, cp = self.cont_rec, self.cont_pos
            for k, x in enumerate(ids):
                cr[x] = rec
                cp[x] = lo + k

    def new_rec(self, tokens: list[int], rid: str) -> int:
        rec = self.next_rec
        self.next_rec = rec + 1
        recs = self.recs
        recs[rec] = (tokens, rid)
        self.rec_tokens += len(tokens)
        while len(recs) > 1 and (
            len(recs) > self.recs_max or self.rec_tokens > self.rec_tokens_max
        ):
            _, (old, _) = recs.popitem(last=False)
            self.rec_tokens -= len(old)
        return rec

    def cont(self, x: int) -> tuple[list[int], str | None]:
        """The tokens that followed physical block ``x`` (up to a block)."""
        got = self.recs.get(int(self.cont_rec[x]))
        if got is None:
            return [], None
        ref, rid = got
        start = (int(self.cont_pos[x]) + 1) * self.bs
        return ref[start : start + self.bs], rid

    def on_finish(
        self, rec: int, num_tokens: int, all_tokens: list[int], table0: list[Any]
    ) -> None:
        """What followed the blocks of record ``rec``'s request (``num_tokens``
        prompt tokens) since its admission: decode tokens, the tail."""
        full = len(all_tokens) // self.bs
        if rec in self.recs:
            lo = max(0, num_tokens // self.bs - 1)
            if full > lo:
                self.set_cont([b.block_id for b in table0[lo:full]], rec, lo)
            self.rec_tokens += len(all_tokens) - num_tokens
