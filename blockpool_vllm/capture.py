"""A snapshot of the engine's pool taken a little at a time, copy-on-write.

Reading a GPU-sized pool (500k blocks) whole takes longer than many engine
steps, so a ``Capture`` fixes the moment (a batch boundary: the operation
count, the batch number and the pool's digest then) and copies the blocks
over the following steps, a slice per step (``advance``, bounded in time),
or on the sender's thread while the engine is idle.  Any pool call that
would change a block not yet copied copies it first (``save``, called by
the follower's wrappers before the call with the blocks it may change: the
blocks named, and their neighbours in the free queue); so every copy is
the block as it was at the moment fixed.  The order of a hash-map key held
by several blocks is copied before the first call that changes it.  Once
every block is copied, ``snapshot`` builds the message (on the sender's
thread); the mirror checks the engine's digest against it, which also
proves the copy.

A reset of the prefix cache changes every block: the follower abandons a
capture in progress and starts again after it.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable
from typing import Any

from blockpool.mirror.digest import NOT_QUEUED
from blockpool.mirror.protocol import Snapshot

SLICE = 512  # blocks copied between two looks at the clock


def _link(b: Any) -> int:
    return NOT_QUEUED if b is None else int(b.block_id)


class Capture:
    def __init__(
        self,
        pool: Any,
        *,
        ops: int,
        seq: int,
        digest: str,
        stats: tuple[int, int, int],
        boot: str,
    ) -> None:
        self.pool = pool
        self.ops, self.seq, self.digest, self.stats, self.boot = ops, seq, digest, stats, boot
        self.ts = time.time()
        n = len(pool.blocks)
        self.n = n
        self.refs = array("i", bytes(4 * n))
        self.prev = array("i", [NOT_QUEUED]) * n
        self.next = array("i", [NOT_QUEUED]) * n
        self.key_lens = bytearray(n)
        self.keys: list[bytes | None] = [None] * n
        self.saved = bytearray(n)
        self.saved[0] = 1  # the null block: free and unhashed, as a snapshot says
        self.left = n - 1  # blocks not copied yet
        self.cursor = 1
        # keys held as a dict of blocks, their blocks in order (as at the moment)
        self.dups: dict[bytes, list[int]] = {}
        self.started = time.monotonic()

    @property
    def done(self) -> bool:
        return self.left == 0

    # ------------------------------------------------------------- copying

    def save(self, b: Any) -> None:
        """Copy block ``b`` if it is not copied yet (before a call changes it)."""
        bid = b.block_id
        if bid <= 0 or self.saved[bid]:
            return
        self.refs[bid] = b.ref_cnt
        self.prev[bid] = _link(b.prev_free_block)
        self.next[bid] = _link(b.next_free_block)
        k = b.block_hash
        if k is not None:
            kb = bytes(k)
            self.keys[bid] = kb
            self.key_lens[bid] = len(kb)
            if kb not in self.dups:
                v = self.pool.cached_block_hash_to_block._cache.get(k)
                if isinstance(v, dict):  # (a dict of one may grow: its order is kept too)
                    self.dups[kb] = list(v)
        self.saved[bid] = 1
        self.left -= 1

    def save_all(self, blocks: Iterable[Any]) -> None:
        for b in blocks:
            self.save(b)

    def save_ids(self, ids: Iterable[int]) -> None:
        blocks = self.pool.blocks
        for bid in ids:
            if 0 < bid < self.n:
                self.save(blocks[bid])

    def save_queued(self, b: Any) -> None:
        """``b`` and its neighbours in the free queue (a removal relinks them)."""
        self.save(b)
        p, nx = b.prev_free_block, b.next_free_block
        if p is not None:
            self.save(p)
        if nx is not None:
            self.save(nx)

    def save_head(self, count: int) -> None:
        """The first ``count`` free blocks and the one after (an allocation
        takes them from the head)."""
        q = self.pool.free_block_queue
        b = q.fake_free_list_head.next_free_block
        tail = q.fake_free_list_tail
        for _ in range(count + 1):
            if b is None or b is tail:
                return
            self.save(b)
            b = b.next_free_block

    def save_ends(self) -> None:
        """The first and last free blocks (a free links blocks at either end)."""
        q = self.pool.free_block_queue
        for b in (q.fake_free_list_head.next_free_block, q.fake_free_list_tail.prev_free_block):
            if b is not None and b.block_id > 0:
                self.save(b)

    def cached(self, keys: Iterable[bytes], new: set[int]) -> None:
        """After a cache call: a key that now holds several blocks kept its
        earlier blocks' order (new blocks join at the end)."""
        cache = self.pool.cached_block_hash_to_block._cache
        for kb in keys:
            if kb in self.dups:
                continue
            v = cache.get(kb)
            if isinstance(v, dict):
                self.dups[kb] = [bid for bid in v if bid not in new]

    def advance(self, budget_s: float) -> None:
        """Copy the next blocks not copied yet, for about ``budget_s``."""
        blocks, saved, save = self.pool.blocks, self.saved, self.save
        n = self.n
        deadline = time.perf_counter() + budget_s
        c = self.cursor
        while c < n:
            end = min(n, c + SLICE)
            for bid in range(c, end):
                if not saved[bid]:
                    save(blocks[bid])
            c = end
            if time.perf_counter() >= deadline:
                break
        self.cursor = c

    # ------------------------------------------------------------- message

    def snapshot(self, problems: list[str]) -> Snapshot:
        """The message (once ``done``), built off the engine's thread."""
        keys = self.keys
        return Snapshot(
            ops=self.ops,
            seq=self.seq,
            ts=self.ts,
            num_blocks=self.n,
            refs=self.refs.tobytes(),
            prev=self.prev.tobytes(),
            next=self.next.tobytes(),
            key_lens=bytes(self.key_lens),
            keys=b"".join([k for k in keys if k is not None]),
            dups=[(k, ids) for k, ids in self.dups.items() if len(ids) > 1],
            stats=self.stats,
            problems=list(problems),
            digest=self.digest,
            boot=self.boot,
        )
