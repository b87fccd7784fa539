"""Following a block pool: every call that changes it, recorded as it happens.

``PoolFollower`` wraps the pool *object's* methods (its instance attributes:
vLLM's classes and files are left as they are) so that each call is kept as
one operation of the mirror protocol (blockpool/mirror/protocol.py), and
``flush`` hands the operations since the last flush to a sender as one
``Batch``.  Works on vLLM's BlockPool (0.16 and >= 0.24) and on blockpool's,
which is how it is tested without vLLM.

Cost on the engine's thread: a list append per pool call and, every
``digest_every`` flushes, one digest of the pool (O(blocks)).  Nothing here
blocks: a full sender queue drops the batch and counts it (the mirror sees
the gap and resyncs).

A snapshot may be taken from another thread: the pool calls bump ``epoch``
before and after (odd while one runs), and ``capture`` retries until it read
the pool between two calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from time import perf_counter_ns as _now
from typing import Any

from blockpool.mirror.poolview import pool_digest, snapshot_of
from blockpool.mirror.protocol import (
    OP_ALLOCATE,
    OP_CACHE,
    OP_EVICT,
    OP_FREE,
    OP_RESET,
    OP_TOUCH,
    OP_UNSUPPORTED,
    Batch,
    Digest,
    Snapshot,
)

# The pool methods the follower wraps: each call becomes one operation.
WRAPPED = (
    "get_new_blocks",
    "free_blocks",
    "touch",
    "cache_full_blocks",
    "evict_blocks",
    "reset_prefix_cache",
)
# Pool methods that change it in ways the mirror does not model (vLLM >= 0.2x).
UNSUPPORTED_METHODS = ("cache_partial_block", "unpin_blocks", "move_block_hashes")


class PoolFollower:
    def __init__(
        self,
        pool: Any,
        offer: Callable[[Batch], bool],
        *,
        digest_every: int = 16,
        stats: Callable[[], tuple[int, int, int]] | None = None,
    ) -> None:
        self.pool = pool
        self.offer = offer  # hands a batch to the sender; False: dropped
        self.digest_every = max(1, digest_every)
        self.stats = stats or (lambda: (0, 0, 0))
        self.ops: list[list[Any]] = []
        self.requests: list[list[Any]] = []
        self.op_count = 0  # operations recorded since the start
        self.first_op = 0  # the index of self.ops[0]
        self.seq = 0  # batches made
        self.step = 0
        self.drops = 0
        self.epoch = 0  # odd while a pool call runs (capture's consistency check)
        self.problems: list[str] = []
        self.cost_ns = 0  # time spent recording and flushing (not the pool's own calls)
        self._wrap()

    # ------------------------------------------------------------ wrapping

    def _wrap(self) -> None:
        pool = self.pool
        ops = self.ops
        # the originals, in the order of WRAPPED
        get_new_blocks, free_blocks, touch, cache_full_blocks, evict_blocks, reset_prefix_cache = (
            getattr(pool, name) for name in WRAPPED
        )
        hash_block_size = pool.hash_block_size

        def _get_new_blocks(num_blocks: int) -> Any:
            self.epoch += 1
            try:
                ret = get_new_blocks(num_blocks)
                t = _now()
                if ret:
                    ops.append([OP_ALLOCATE, [b.block_id for b in ret]])
                    self.op_count += 1
                self.cost_ns += _now() - t
                return ret
            finally:
                self.epoch += 1

        def _free_blocks(ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            self.epoch += 1
            try:
                free_blocks(blocks)
                t = _now()
                if blocks:
                    ops.append([OP_FREE, [b.block_id for b in blocks]])
                    self.op_count += 1
                self.cost_ns += _now() - t
            finally:
                self.epoch += 1

        def _touch(blocks: Any) -> None:
            blocks = list(blocks)
            self.epoch += 1
            try:
                touch(blocks)
                t = _now()
                if blocks:
                    ops.append([OP_TOUCH, [b.block_id for b in blocks]])
                    self.op_count += 1
                self.cost_ns += _now() - t
            finally:
                self.epoch += 1

        def _cache_full_blocks(
            request: Any,
            blocks: Any,
            num_cached_blocks: int,
            num_full_blocks: int,
            block_size: int,
            kv_cache_group_id: int,
            *rest: Any,
            **kw: Any,
        ) -> None:
            window = list(blocks[num_cached_blocks:num_full_blocks])
            before = [b.block_hash for b in window]
            self.epoch += 1
            try:
                cache_full_blocks(
                    request,
                    blocks,
                    num_cached_blocks,
                    num_full_blocks,
                    block_size,
                    kv_cache_group_id,
                    *rest,
                    **kw,
                )
                t = _now()
                ids: list[int] = []
                hashes: list[bytes] = []
                first = -1
                for i, (blk, old) in enumerate(zip(window, before, strict=True)):
                    new = blk.block_hash
                    if new is None or new == old:
                        continue
                    if old is not None:
                        self._unsupported("a cached block re-hashed (partial-block caching)")
                        return
                    if first < 0:
                        first = num_cached_blocks + i
                    ids.append(blk.block_id)
                    hashes.append(bytes(new)[:-4])
                if not ids:
                    return
                parent = None
                if first > 0:
                    if block_size != hash_block_size:
                        self._unsupported("a group whose block size is not the hash block size")
                        return
                    parent = bytes(request.block_hashes[first - 1])
                ops.append([OP_CACHE, int(kv_cache_group_id), parent, ids, hashes])
                self.op_count += 1
                self.cost_ns += _now() - t
            finally:
                self.epoch += 1

        def _evict_blocks(block_ids: Any) -> None:
            ids = list(block_ids)
            self.epoch += 1
            try:
                evict_blocks(set(ids) if isinstance(block_ids, set) else ids)
                if ids:
                    ops.append([OP_EVICT, ids])
                    self.op_count += 1
            finally:
                self.epoch += 1

        def _reset_prefix_cache() -> bool:
            self.epoch += 1
            try:
                done: bool = reset_prefix_cache()
                if done:
                    ops.append([OP_RESET])
                    self.op_count += 1
                return done
            finally:
                self.epoch += 1

        wrappers = (
            _get_new_blocks,
            _free_blocks,
            _touch,
            _cache_full_blocks,
            _evict_blocks,
            _reset_prefix_cache,
        )
        for name, wrapper in zip(WRAPPED, wrappers, strict=True):
            setattr(pool, name, wrapper)
        for name in UNSUPPORTED_METHODS:
            original = getattr(pool, name, None)
            if original is not None:
                setattr(pool, name, self._flagging(name, original))

    def _flagging(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            self.epoch += 1
            try:
                return original(*args, **kw)
            finally:
                self._unsupported(f"BlockPool.{name}")
                self.epoch += 1

        return call

    def _unsupported(self, what: str) -> None:
        if what not in self.problems:
            self.problems.append(what)
        self.ops.append([OP_UNSUPPORTED, what])
        self.op_count += 1

    # ------------------------------------------------------------ requests

    def request(self, record: list[Any]) -> None:
        """Note what happened to a request (kind, id, ts, ...)."""
        self.requests.append(record)

    # ------------------------------------------------------------- batches

    def flush(self, force_digest: bool = False) -> Batch | None:
        """The operations and request records since the last flush, as one
        batch handed to the sender (None when there was nothing)."""
        if not self.ops and not self.requests and not force_digest:
            return None
        t = _now()
        self.step += 1
        self.seq += 1
        digest = None
        if force_digest or self.step % self.digest_every == 0:
            digest = Digest(self.op_count, pool_digest(self.pool))
        batch = Batch(
            seq=self.seq,
            step=self.step,
            ts=time.time(),
            first_op=self.first_op,
            ops=self.ops[:],
            requests=self.requests[:],
            stats=self.stats(),
            drops=self.drops,
            digest=digest,
        )
        self.ops.clear()
        self.requests.clear()
        self.first_op = self.op_count
        if not self.offer(batch):
            self.drops += 1
        self.cost_ns += _now() - t
        return batch

    # ----------------------------------------------------------- snapshots

    def capture(self, tries: int = 2000) -> Snapshot | None:
        """The pool between two of its calls, from any thread (None: the
        engine never paused long enough)."""
        for _ in range(tries):
            e0 = self.epoch
            if e0 & 1:
                time.sleep(0.0002)
                continue
            ops, seq = self.op_count, self.seq
            try:
                snap = snapshot_of(self.pool, ops, seq, time.time(), self.stats())
            except (RuntimeError, AttributeError):  # changed under us
                continue
            if self.epoch == e0:
                snap.problems = list(self.problems)
                return snap
        return None
