"""Per-block state as columns, kept in step with the pool by the runtime.

The runtime tells ``sync`` which blocks an operation touched; the columns then
hold, for every block: its state (null / in use / cached-evictable / empty),
ref count, whether it is hashed, the 64-bit form of its hash and its group,
and its queue stamp.  Free blocks sorted by stamp are exactly the free queue
from head to tail, so a client that mirrors these columns knows the LRU order
without list diffs (docs/architecture.md, "The free order's stamping rule").
The stamping rule is the pool's free order's
(``blockpool.core.free_order.QueueStamps``): blocks entering at the tail get
stamps above every other, blocks entering at the head (``uncached_first``)
stamps below every other, possibly negative.

Counts per state are maintained incrementally: O(touched) per operation.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from blockpool.common.keys import key64, key_group
from blockpool.core.block import KVCacheBlock
from blockpool.core.free_order import QueueStamps
from blockpool.core.pool import BlockPool

NULL, IN_USE, CACHED, EMPTY = 0, 1, 2, 3
STATE_NAMES = ("null", "in_use", "cached", "empty")
BULK = 24  # blocks per sync from which the columns are written in one go


class BlockColumns:
    """Numpy columns mirroring every block of one pool."""

    def __init__(self, pool: BlockPool) -> None:
        n = pool.num_gpu_blocks
        self.pool = pool
        self.state = np.full(n, EMPTY, dtype=np.uint8)
        self.ref_cnt = np.zeros(n, dtype=np.int32)
        self.hashed = np.zeros(n, dtype=np.uint8)
        self.hash64 = np.zeros(n, dtype=np.uint64)
        self.group = np.zeros(n, dtype=np.uint32)
        self.stamp = np.arange(n, dtype=np.int64)
        self.dirty = np.zeros(n, dtype=np.bool_)
        self.counts = [0, 0, 0, 0]
        self.stamps = QueueStamps(pool.free_order, pool.enable_caching, low=0, high=n)
        self.resync_all()

    @property
    def next_stamp(self) -> int:
        """The stamp the next block entering at the queue's tail gets."""
        return self.stamps.high

    @property
    def num_blocks(self) -> int:
        return len(self.state)

    def resync_all(self) -> None:
        """Recompute every column from the pool (start-up, reset): O(N),
        vectorised where it can be.  Stamps follow the queue's current order."""
        blocks = self.pool.blocks
        n = len(blocks)
        refs = np.fromiter((b.ref_cnt for b in blocks), dtype=np.int64, count=n)
        keys = [b._block_hash for b in blocks]
        hashed = np.fromiter((k is not None for k in keys), dtype=np.uint8, count=n)
        refs[0] = 0  # the null block's count is not kept
        self.ref_cnt[:] = refs
        self.hashed[:] = hashed
        self.hash64[:] = 0
        self.group[:] = 0
        for bid in np.flatnonzero(hashed).tolist():
            key = keys[bid]
            assert key is not None
            self.hash64[bid] = key64(key)
            self.group[bid] = key_group(key)
        state = np.where(refs > 0, IN_USE, np.where(hashed == 1, CACHED, EMPTY))
        state[0] = NULL
        self.state[:] = state
        # the queue, head first, from next_stamp; next_stamp then moves on by n
        first = self.stamps.high
        self.stamps.stamp_queue(self.pool.free_block_queue, self.stamp)
        self.stamps.high = first + n
        self.counts = np.bincount(self.state, minlength=4).astype(int).tolist()
        self.dirty[:] = True

    def stamp_freed(self, ordered: Iterable[KVCacheBlock]) -> None:
        """Call after ``pool.free_blocks(ordered)``: stamps the blocks that
        reached 0 where the pool's free order put them."""
        self.stamps.stamp_freed(ordered, self.stamp)

    def sync(self, ids: Iterable[int]) -> None:
        """Re-read the given blocks after an operation touched them."""
        if isinstance(ids, list) and len(ids) >= BULK:
            self._sync_bulk(ids)
            return
        # _read inlined (a decode step syncs a block or two per operation)
        counts = self.counts
        state, ref_cnt, hashed, hash64, group = (
            self.state,
            self.ref_cnt,
            self.hashed,
            self.hash64,
            self.group,
        )
        dirty = self.dirty
        blocks = self.pool.blocks
        from_bytes = int.from_bytes
        for bid in ids:
            b = blocks[bid]
            key = b._block_hash
            ref = b.ref_cnt
            if b.is_null:
                new = NULL
                ref = 0
            elif ref > 0:
                new = IN_USE
            else:
                new = EMPTY if key is None else CACHED
            old = int(state[bid])
            if new != old:
                counts[old] -= 1
                counts[new] += 1
                state[bid] = new
            ref_cnt[bid] = ref
            if key is None:
                hashed[bid] = 0
                hash64[bid] = 0
                group[bid] = 0
            else:
                hashed[bid] = 1
                hash64[bid] = from_bytes(key[-12:-4], "big")  # key64, key_group
                group[bid] = from_bytes(key[-4:], "big")
            dirty[bid] = True

    def _sync_bulk(self, ids: list[int]) -> None:
        """``sync`` of many blocks (a prefill, a finish): read in Python,
        written to the columns in one assignment each."""
        ids = list(dict.fromkeys(ids))  # once each, as sequential reads count them
        blocks = self.pool.blocks
        n = len(ids)
        states = bytearray(n)
        hashed = bytearray(n)
        refs = [0] * n
        h64 = [0] * n
        groups = [0] * n
        for i, bid in enumerate(ids):
            b = blocks[bid]
            key = b._block_hash
            ref = b.ref_cnt
            if b.is_null:
                st = NULL
                ref = 0
            elif ref > 0:
                st = IN_USE
            else:
                st = EMPTY if key is None else CACHED
            states[i] = st
            refs[i] = ref
            if key is not None:
                hashed[i] = 1
                h64[i] = int.from_bytes(key[-12:-4], "big")  # key64, key_group
                groups[i] = int.from_bytes(key[-4:], "big")
        idx = np.array(ids, dtype=np.intp)
        new = np.frombuffer(states, dtype=np.uint8)
        old = self.state[idx]
        moved = old != new
        if moved.any():
            counts = self.counts
            for st, k in enumerate(np.bincount(old[moved], minlength=4).tolist()):
                counts[st] -= k
            for st, k in enumerate(np.bincount(new[moved], minlength=4).tolist()):
                counts[st] += k
        self.state[idx] = new
        self.ref_cnt[idx] = refs
        self.hashed[idx] = np.frombuffer(hashed, dtype=np.uint8)
        self.hash64[idx] = h64
        self.group[idx] = groups
        self.dirty[idx] = True

    def take_dirty(self) -> np.ndarray:
        """Ids changed since the last call, ascending; clears the marks."""
        idx = np.flatnonzero(self.dirty)
        self.dirty[idx] = False
        return idx

    def queue_order(self) -> np.ndarray:
        """Free block ids from head (next to go) to tail."""
        free = np.flatnonzero((self.state == CACHED) | (self.state == EMPTY))
        return free[np.argsort(self.stamp[free], kind="stable")]

    def queue_position(self, bid: int) -> int | None:
        """0-based position in the free queue, or None if not free."""
        st = self.state[bid]
        if st not in (CACHED, EMPTY):
            return None
        free = (self.state == CACHED) | (self.state == EMPTY)
        return int(np.count_nonzero(free & (self.stamp < self.stamp[bid])))

    def summary(self) -> dict[str, int]:
        c = self.counts
        return {"null": c[NULL], "in_use": c[IN_USE], "cached": c[CACHED], "empty": c[EMPTY]}
