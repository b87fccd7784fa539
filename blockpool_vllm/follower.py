"""Following a block pool: every call that changes it, recorded as it happens.

``PoolFollower`` wraps the pool *object's* methods (its instance attributes:
vLLM's classes and files are left as they are) so that each call is kept as
one typed operation of the mirror protocol (blockpool/mirror/protocol.py),
and ``flush`` hands the operations since the last flush to a sender as one
``Batch``.  Works on vLLM's BlockPool (0.16 and >= 0.24) and on blockpool's,
which is how it is tested without vLLM.

Cost on the engine's thread, per scheduler step, is O(what the step did):
an append per pool call, never a walk over the pool.  The digest over the
blocks the step named (``PoolDigest``) is brought up to date at ``flush``,
or -- ``defer_digest``, what the plugin does -- off the engine's thread:
``catch_up``, from the sender's thread, reads the pool while the engine is
between batches (during its forward pass) and throws the reading away when
a pool call ran meanwhile; the digest then rides on the next batch (or
beat) for the boundary it was taken at.  A snapshot is
copied a slice per step (``Capture``), and by the sender's thread while the
engine is idle.  Nothing here blocks on I/O: a full sender queue drops the
batch and counts it (the mirror sees the gap and resyncs).  The time each
step spent here is kept per step (``cost_quantiles``: p50, p99, max).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable
from time import perf_counter_ns as _now
from typing import Any

from blockpool.mirror.digest import PoolDigest
from blockpool.mirror.protocol import (
    Allocate,
    Batch,
    Cache,
    Digest,
    Evict,
    Free,
    Op,
    Record,
    Reset,
    Snapshot,
    Touch,
    Unsupported,
)
from blockpool_vllm.capture import Capture

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
COSTS_KEPT = 2048  # the last steps' costs, for the quantiles
CAPTURE_BUDGET_S = 0.0008  # a step's share of copying a snapshot
IDLE_AFTER_S = 0.05  # no step for this long: the sender's thread copies instead


class PoolFollower:
    def __init__(
        self,
        pool: Any,
        offer: Callable[[Batch], bool],
        *,
        digest_every: int = 1,
        stats: Callable[[], tuple[int, int, int]] | None = None,
        boot: str = "",
        defer_digest: bool = False,
    ) -> None:
        self.pool = pool
        self.defer_digest = defer_digest
        self.offer = offer  # hands a batch to the sender; False: dropped
        self.digest_every = max(1, digest_every)
        self.stats = stats or (lambda: (0, 0, 0))
        self.boot = boot
        self.ops: list[Op] = []
        self.requests: list[Record] = []
        self.touched: list[int] = []  # block ids the calls since the last flush named
        self.op_count = 0  # operations recorded since the start
        self.first_op = 0  # the index of self.ops[0]
        self.seq = 0  # batches made
        self.step = 0
        self.drops = 0
        self.epoch = 0  # odd while a pool call runs
        self.problems: list[str] = []
        self.cost_ns = 0  # time spent recording and flushing (not the pool's own calls)
        self._step_ns = 0  # this step's share of it so far
        self.costs = array("d", bytes(8 * COSTS_KEPT))  # µs per step, a ring
        self.cost_max_us = 0.0
        self.digest = PoolDigest(pool)  # O(pool), once, at start
        self.digest_ops = 0  # the digest is of the pool after this many operations
        self.flushed_ops = 0  # operations up to the last flush (a batch boundary)
        self.pending: list[list[int]] = []  # deferred: flushed blocks not in the digest yet
        self.verified: Digest | None = None  # deferred: taken off the engine's thread
        self.digests_taken = 0  # deferred digests taken by catch_up
        self.digests_discarded = 0  # ... and readings thrown away (the engine moved)
        self._digest_lock = threading.Lock()  # catch_up vs. the engine's own update
        # snapshots: asked for by the sender (any thread), copied here
        self.want_snapshot = False
        self.capture: Capture | None = None
        self.captured: Capture | None = None  # a finished copy, for the sender
        self.captures_abandoned = 0
        self.last_flush = time.monotonic()
        self._lock = threading.Lock()  # the sender copying while the engine is idle
        self._wrap()

    # ------------------------------------------------------------ wrapping

    def _wrap(self) -> None:
        pool = self.pool
        ops = self.ops
        touched = self.touched
        lock = self._lock
        # the originals, in the order of WRAPPED
        get_new_blocks, free_blocks, touch, cache_full_blocks, evict_blocks, reset_prefix_cache = (
            getattr(pool, name) for name in WRAPPED
        )
        hash_block_size = pool.hash_block_size

        def _get_new_blocks(num_blocks: int) -> Any:
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            cap = self.capture
            try:
                if cap is not None:
                    with lock:
                        cap.save_head(num_blocks)
                        ret = get_new_blocks(num_blocks)
                else:
                    ret = get_new_blocks(num_blocks)
                t = _now()
                if ret:
                    ids = [b.block_id for b in ret]
                    ops.append(Allocate(ids))
                    touched.extend(ids)
                    self.op_count += 1
                self._step_ns += _now() - t
                return ret
            finally:
                self.epoch += 1

        def _free_blocks(ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            cap = self.capture
            try:
                if cap is not None:
                    with lock:
                        cap.save_all(blocks)
                        cap.save_ends()
                        free_blocks(blocks)
                else:
                    free_blocks(blocks)
                t = _now()
                if blocks:
                    ids = [b.block_id for b in blocks]
                    ops.append(Free(ids))
                    touched.extend(ids)
                    self.op_count += 1
                self._step_ns += _now() - t
            finally:
                self.epoch += 1

        def _touch(blocks: Any) -> None:
            blocks = list(blocks)
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            cap = self.capture
            try:
                if cap is not None:
                    with lock:
                        for b in blocks:
                            cap.save_queued(b)
                        touch(blocks)
                else:
                    touch(blocks)
                t = _now()
                if blocks:
                    ids = [b.block_id for b in blocks]
                    ops.append(Touch(ids))
                    touched.extend(ids)
                    self.op_count += 1
                self._step_ns += _now() - t
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
            window = blocks[num_cached_blocks:num_full_blocks]
            before = [b.block_hash for b in window]
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            cap = self.capture
            try:
                args = (request, blocks, num_cached_blocks, num_full_blocks, block_size)
                if cap is not None:
                    with lock:
                        cap.save_all(window)
                        cache_full_blocks(*args, kv_cache_group_id, *rest, **kw)
                        new = [b for b, old in zip(window, before, strict=True) if old is None]
                        cap.cached(
                            {bytes(b.block_hash) for b in new if b.block_hash is not None},
                            {b.block_id for b in new},
                        )
                else:
                    cache_full_blocks(*args, kv_cache_group_id, *rest, **kw)
                t = _now()
                ids: list[int] = []
                hashes: list[bytes] = []
                first = -1
                for i, (blk, old) in enumerate(zip(window, before, strict=True)):
                    new_hash = blk.block_hash
                    if new_hash is None or new_hash == old:
                        continue
                    if old is not None:
                        self._unsupported("a cached block re-hashed (partial-block caching)")
                        return
                    if first < 0:
                        first = num_cached_blocks + i
                    ids.append(blk.block_id)
                    hashes.append(bytes(new_hash)[:-4])
                if ids:
                    parent = None
                    if first > 0:
                        if block_size != hash_block_size:
                            self._unsupported("a group whose block size is not the hash block size")
                            return
                        parent = bytes(request.block_hashes[first - 1])
                    ops.append(Cache(int(kv_cache_group_id), parent, ids, hashes))
                    touched.extend(ids)
                    self.op_count += 1
                self._step_ns += _now() - t
            finally:
                self.epoch += 1

        def _evict_blocks(block_ids: Any) -> None:
            ids = list(block_ids)
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            cap = self.capture
            try:
                arg = set(ids) if isinstance(block_ids, set) else ids
                if cap is not None:
                    with lock:
                        cap.save_ids(ids)
                        evict_blocks(arg)
                else:
                    evict_blocks(arg)
                if ids:
                    ops.append(Evict(ids))
                    touched.extend(ids)
                    self.op_count += 1
            finally:
                self.epoch += 1

        def _reset_prefix_cache() -> bool:
            self.epoch += 1
            try:
                done: bool = reset_prefix_cache()
                if done:
                    self._abandon_capture()
                    ops.append(Reset())
                    touched.append(-1)
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
        self._abandon_capture()
        self.ops.append(Unsupported(what[:2000]))
        self.touched.append(-2)
        self.op_count += 1

    def _abandon_capture(self) -> None:
        """The pool changed as a whole: a copy in progress is of no moment."""
        if self.capture is not None:
            with self._lock:
                self.capture = None
            self.captures_abandoned += 1
            self.want_snapshot = True  # start again at the next step

    # ------------------------------------------------------------ requests

    def request(self, record: Record) -> None:
        """Note what happened to a request."""
        self.requests.append(record)

    # ------------------------------------------------------------- batches

    def flush(self, force_digest: bool = False) -> Batch | None:
        """The operations and request records since the last flush, as one
        batch handed to the sender (None when there was nothing)."""
        t = _now()
        batch = None
        if self.ops or self.requests or force_digest:
            batch = self._batch(force_digest)
        self._capture_step()
        self.last_flush = time.monotonic()
        spent = self._step_ns + _now() - t
        self._step_ns = 0
        self.cost_ns += spent
        us = spent / 1000.0
        self.costs[self.step % COSTS_KEPT] = us
        if us > self.cost_max_us:
            self.cost_max_us = us
        return batch

    def _batch(self, force_digest: bool) -> Batch:
        touched = self.touched
        deferred = self.defer_digest and not force_digest
        if deferred and -1 not in touched and -2 not in touched:
            if touched:
                self.pending.append(touched[:])  # for catch_up
                touched.clear()
        elif touched or self.pending or force_digest:
            with self._digest_lock:  # rare here when deferred: a reset, a forced digest
                self._update_digest()
        self.flushed_ops = self.op_count
        self.step += 1
        self.seq += 1
        digest = None
        if force_digest or (not deferred and self.step % self.digest_every == 0):
            digest = Digest(self.op_count, self.digest.value)
        elif deferred and self.verified is not None:
            digest, self.verified = self.verified, None
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
            boot=self.boot,
        )
        self.ops.clear()
        self.requests.clear()
        self.first_op = self.op_count
        if not self.offer(batch):
            self.drops += 1
        return batch

    def _update_digest(self) -> None:
        """The digest brought up to date on this thread (the engine's)."""
        touched = self.touched
        for ids in self.pending:
            touched.extend(ids)
        self.pending.clear()
        if touched:
            if -2 in touched:  # something not followed: every block re-read
                self.digest.refresh()
            elif -1 in touched:  # a reset: the blocks that held a hash (and the rest)
                self.digest.update([i for i in touched if i > 0])
                self.digest.after_reset()  # (after: update reads the old links)
            else:
                self.digest.update(touched)
            touched.clear()
        self.digest_ops = self.op_count

    # ------------------------------------------------ the deferred digest

    def catch_up(self) -> bool:
        """From the sender's thread (``defer_digest``): the digest brought up
        to the last flush, if the engine is between batches -- no pool call
        running, none since the flush -- and stays so while the pool is read;
        else nothing changes (False).  The digest taken rides on the next
        batch; a snapshot asked for starts here, at the same boundary."""
        if not self.pending:
            return False
        with self._digest_lock:
            e0 = self.epoch
            target = self.flushed_ops
            if e0 & 1 or self.op_count != target or not self.pending:
                return False
            n = len(self.pending)
            ids = [i for part in self.pending[:n] for i in part]
            try:
                staged = self.digest.stage(ids)
            except Exception:  # the pool changed under the reading
                staged = None
            if staged is None or self.epoch != e0 or self.op_count != target:
                self.digests_discarded += 1
                return False
            self.digest.commit(staged)
            del self.pending[:n]
            self.digest_ops = target
            self.verified = Digest(target, self.digest.value)
            self.digests_taken += 1
        if self.want_snapshot:
            self._start_capture_between_steps()
        return True

    def latest_digest(self) -> Digest | None:
        """The newest digest and the boundary it is of (for a beat)."""
        with self._digest_lock:
            if self.digest_ops != self.flushed_ops or self.pending:
                return None  # the engine moved since: the next catch_up has it
            return Digest(self.digest_ops, self.digest.value)

    def cost_quantiles(self) -> tuple[float, float, float] | None:
        """The follower's time per step on the engine's thread (µs): p50 and
        p99 of the last steps, the maximum since the start."""
        n = min(self.step, COSTS_KEPT)
        if n == 0:
            return None
        s = sorted(self.costs[:n])
        return (s[n // 2], s[min(n - 1, (n * 99) // 100)], self.cost_max_us)

    # ----------------------------------------------------------- snapshots

    def _start_capture(self) -> Capture | None:
        """A copy of the pool as it is now (between steps: no pending call)."""
        if self.ops or self.touched or self.digest_ops != self.op_count:
            return None  # mid-step, or the digest is not of this moment yet
        return Capture(
            self.pool,
            ops=self.op_count,
            seq=self.seq,
            digest=self.digest.value,
            stats=self.stats(),
            boot=self.boot,
        )

    def _capture_step(self) -> None:
        """A step's share of copying a snapshot (the engine's thread)."""
        if self.want_snapshot and self.capture is None and self.captured is None:
            cap = self._start_capture()
            if cap is not None:
                with self._lock:
                    self.capture = cap
                    self.want_snapshot = False
        cap = self.capture
        if cap is not None:
            with self._lock:
                cap.advance(CAPTURE_BUDGET_S)
                if cap.done:
                    self.captured, self.capture = cap, None

    def capture_now(self) -> Snapshot:
        """The pool copied at once, on the caller's thread (tests and tools;
        calls recorded since the last flush are flushed first)."""
        if self.ops or self.requests:
            self._batch(False)
        with self._digest_lock:
            self._update_digest()
        cap = self._start_capture()
        assert cap is not None
        cap.advance(float("inf"))
        return cap.snapshot(self.problems)

    def poll_snapshot(self) -> Snapshot | None:
        """From the sender's thread: a finished snapshot, else ask for one and,
        while the engine is idle, copy a slice of it here.  Call again until
        it returns one."""
        done = self.captured
        if done is not None:
            self.captured = None
            return done.snapshot(self.problems)
        if self.capture is None:
            self.want_snapshot = True
            if self.defer_digest:
                self.catch_up()  # between steps: the digest, then the copy, start here
        if time.monotonic() - self.last_flush < IDLE_AFTER_S or self.epoch & 1:
            return None
        if (
            self.capture is None
            and self.captured is None
            and not self._start_capture_between_steps()
        ):
            return None
        with self._lock:
            cap = self.capture
            if cap is not None:
                cap.advance(0.002)
                if cap.done:
                    self.captured, self.capture = cap, None
        return None

    def _start_capture_between_steps(self) -> bool:
        """From the sender's thread: a copy started now, if no pool call runs
        (one that begins meanwhile may not have seen it: undone)."""
        with self._digest_lock, self._lock:
            if self.epoch & 1 or self.capture is not None or self.captured is not None:
                return False
            e0 = self.epoch
            cap = self._start_capture()
            if cap is None:
                return False
            self.capture = cap
            if self.epoch != e0:
                self.capture = None
                return False
            self.want_snapshot = False
            return True
