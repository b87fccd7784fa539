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
or -- ``defer_digest`` -- off the engine's thread: ``catch_up``, from the
sender's thread, reads the pool while the engine is between batches (in
its forward pass: ``forward_begins`` .. ``forward_ends``, or idle), a
batch's blocks at a time, and keeps each batch's reading that the engine
did not interrupt (one it did is read again at the next moment); once no
batch is left at such a moment, the digest is the pool's and rides on the
next batch (or beat) for the boundary it was taken at.  It plans each
forward pass by the shortest of the last ones: no batch's reading begun
that would end after the engine is back.  When the blocks left to read
are more than a quarter of the pool, or after a reset or a call not
followed, the digest is rebuilt in pieces over the next forward passes
(``DigestSweep``), planned the same way (no piece begun that would end
after the engine is back): the engine's thread never reads the pool.  A snapshot is
copied a slice per step (``Capture``), and by the sender's thread while the
engine is idle.  Nothing here blocks on I/O: a full sender queue drops the
batch and counts it (the mirror sees the gap and resyncs).  The time each
step spent here is kept per step (``cost_quantiles``: p50, p99, max).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns as _now
from typing import Any

from blockpool.mirror.digest import PoolDigest
from blockpool.mirror.digest_sweep import PIECE, DigestSweep
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
from blockpool_vllm.pacing import Pacer

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
IDLE_AFTER_S = 0.05
# the engine's forward passes as the sender's thread plans its work in one:
# the shortest of the last WINDOWS_KEPT is what it counts on, and it begins no
# batch's reading it expects to end after END_SHARE of it (what it read would
# be thrown away, and the engine, back, would wait for the interpreter).  (It
# keeps pausing from the start: the engine may still run Python a while after
# the pass is handed over -- vLLM's model runner preparing it, the bench's
# fake one sampling -- and a thread that never pauses keeps it waiting for
# the interpreter up to the 5 ms switch interval, measured.)
WINDOWS_KEPT = 16
END_SHARE = 0.85
# batches whose blocks catch_up has not read yet: up to this many, their
# blocks are not even counted (a sender a few passes behind catches up)
MAX_BEHIND = 16
# blocks pending (named by batches the digest has not read yet), at most: a
# fraction of the pool -- beyond, a sweep reads every block once instead
BEHIND_FRACTION = 4
MIN_BEHIND_ROWS = 4096
# batches whose blocks the sweep has not been told of, at most: beyond, it
# starts again (their ids are not kept without bound)
MAX_PENDING = 4096


# what a usual call leaves in ``PoolFollower.ops``, for ``resolve``: one flat
# tuple per call (the kind, then what it gave) -- one object for the garbage
# collector to count, not a tuple and its lists: the engine's collector runs
# no more often for the calls followed while the sender has not read them
_ALLOCATE, _FREE, _TOUCH, _CACHE = 0, 1, 2, 3
_BY_KIND: tuple[type[Allocate] | type[Free] | type[Touch], ...] = (Allocate, Free, Touch)


def resolve(entries: list[Any]) -> tuple[list[Op], list[int]]:
    """The operations of one flush as the wire has them, and the block ids
    they named (-1: a reset, -2: a call not followed) for the digest.  The
    usual calls were kept as the blocks they gave (``(kind, *blocks)``, or for
    a cache call ``(_CACHE, offset, group, n, *window, *hashes after,
    *request's hash chain)``, the window and the hashes ``n`` long) and are
    read here -- off the engine's thread when deferred.  A block's id never
    changes, and what was kept was copied at the call."""
    ops: list[Op] = []
    touched: list[int] = []
    for e in entries:
        if e.__class__ is tuple:
            kind = e[0]
            if kind == _CACHE:
                off, group, n = e[1], e[2], e[3]
                ids: list[int] = []
                hashes: list[bytes] = []
                first = -1
                for i in range(n):
                    h = e[4 + n + i]
                    if h is None:
                        continue
                    if first < 0:
                        first = i
                    ids.append(e[4 + i].block_id)
                    hashes.append(bytes(h)[:-4])
                at = off + first - 1  # the parent's place in the chain kept
                parent = bytes(e[4 + 2 * n + at]) if at >= 0 else None
                ops.append(Cache(int(group), parent, ids, hashes))
            else:
                ids = [b.block_id for b in e[1:]]
                ops.append(_BY_KIND[kind](ids))
            touched.extend(ids)
        else:
            ops.append(e)
            if isinstance(e, Reset):
                touched.append(-1)
            elif isinstance(e, Unsupported):
                touched.append(-2)
            else:
                touched.extend(e.ids)
    return ops, touched


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
        windowed: bool = False,
    ) -> None:
        self.pool = pool
        self.defer_digest = defer_digest
        # windowed: the scheduler's hooks say when the engine is in its forward
        # pass (``forward_begins``, ``forward_ends``): the sender's thread works
        # on the pool then, and lets go of it the moment the engine comes back
        self.window = threading.Condition() if windowed else None
        self.forwarding = False
        self.forward_passes = 0
        self._turn_seen = 0
        self.forward_began = 0  # perf_counter_ns at the last forward_begins
        self.windows = array("q", bytes(8 * WINDOWS_KEPT))  # the last passes' lengths (ns)
        self.deadline = 0  # the sender's: no batch's reading begun that would end after this
        # the sender's speeds, as last measured: reading (a batch's blocks, a
        # sweep's rows) and invalidating (a sweep told of a batch's blocks)
        self.read_ns_per_block = 2_000.0
        self.sweep_ns_per_row = 2_000.0
        self.named_ns_per_block = 1_000.0
        self.windows_overrun = 0  # readings still running when the engine came back
        # the sender's thread sleeps a moment every ~0.1 ms of work, so that an
        # engine back from its forward pass waits no longer for the interpreter
        self.pace = Pacer()
        self.offer = offer  # hands a batch to the sender; False: dropped
        self.digest_every = max(1, digest_every)
        self.stats = stats or (lambda: (0, 0, 0))
        self.boot = boot
        # the calls since the last flush: typed operations, or (for the usual
        # calls) what ``resolve`` turns into them -- the blocks, not their ids
        self.ops: list[Any] = []
        self.requests: list[Record] = []
        # a batch's reset or unsupported call: its digest is taken at its flush
        self._sync_due = False
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
        self.pending: list[array[int]] = []  # deferred: flushed blocks not in the digest yet
        # deferred: beyond this many blocks pending, the digest is rebuilt by a
        # sweep instead (it reads each block once, however often it was named)
        self.max_behind_rows = max(MIN_BEHIND_ROWS, len(pool.blocks) // BEHIND_FRACTION)
        self.verified: Digest | None = None  # deferred: taken off the engine's thread
        self.inflight: deque[Batch] = deque()  # deferred: offered, not prepared by the sender yet
        self.digests_taken = 0  # deferred digests taken by catch_up
        self.digests_discarded = 0  # ... and readings thrown away (the engine moved)
        self.digests_on_engine = 0  # deferred, yet taken here (asked for: force_digest)
        # deferred: the digest rebuilt in pieces by the sender's thread
        # (blockpool/mirror/digest_sweep.py) after it fell behind, a reset, or
        # a call not followed -- never read on the engine's thread
        self.sweep: DigestSweep | None = None
        self.sweep_due = False  # set by the engine's thread, acted on by the sender's
        self.sweeps = 0  # sweeps started
        self.sweeps_finished = 0
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
        lock = self._lock
        # the originals, in the order of WRAPPED
        get_new_blocks, free_blocks, touch, cache_full_blocks, evict_blocks, reset_prefix_cache = (
            getattr(pool, name) for name in WRAPPED
        )
        hash_block_size = pool.hash_block_size

        def _get_new_blocks(num_blocks: int) -> Any:
            t0 = _now()  # (the wrapper's time, the pool's own call left out)
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            cap = self.capture
            try:
                if cap is not None:
                    with lock:
                        cap.save_head(num_blocks)
                        t1 = _now()
                        ret = get_new_blocks(num_blocks)
                else:
                    t1 = _now()
                    ret = get_new_blocks(num_blocks)
                t = _now()
                if ret:
                    ops.append((_ALLOCATE, *ret))  # ids read later (resolve)
                    self.op_count += 1
                self._step_ns += _now() - t + t1 - t0
                return ret
            finally:
                self.epoch += 1

        def _blocks_call(
            kind: int, call: Callable[[list[Any]], None], save: Callable[[Capture, list[Any]], None]
        ) -> Callable[[Any], None]:
            """free_blocks and touch: a call over blocks, kept as one record."""

            def wrapper(some_blocks: Any) -> None:
                t0 = _now()
                blocks = list(some_blocks)
                self.epoch += 1  # before the look at capture (poll_snapshot's check)
                cap = self.capture
                try:
                    if cap is not None:
                        with lock:
                            save(cap, blocks)
                            t1 = _now()
                            call(blocks)
                    else:
                        t1 = _now()
                        call(blocks)
                    t = _now()
                    if blocks:
                        ops.append((kind, *blocks))
                        self.op_count += 1
                    self._step_ns += _now() - t + t1 - t0
                finally:
                    self.epoch += 1

            return wrapper

        def _save_freed(cap: Capture, blocks: list[Any]) -> None:
            cap.save_all(blocks)
            cap.save_ends()

        def _save_touched(cap: Capture, blocks: list[Any]) -> None:
            for b in blocks:
                cap.save_queued(b)

        _free_blocks = _blocks_call(_FREE, free_blocks, _save_freed)
        _touch = _blocks_call(_TOUCH, touch, _save_touched)

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
            t0 = _now()
            window = blocks[num_cached_blocks:num_full_blocks]
            before = [b.block_hash for b in window]
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            cap = self.capture
            try:
                args = (request, blocks, num_cached_blocks, num_full_blocks, block_size)
                if cap is not None:
                    with lock:
                        cap.save_all(window)
                        t1 = _now()
                        cache_full_blocks(*args, kv_cache_group_id, *rest, **kw)
                        new = [b for b, old in zip(window, before, strict=True) if old is None]
                        cap.cached(
                            {bytes(b.block_hash) for b in new if b.block_hash is not None},
                            {b.block_id for b in new},
                        )
                else:
                    t1 = _now()
                    cache_full_blocks(*args, kv_cache_group_id, *rest, **kw)
                t = _now()
                after = [b.block_hash for b in window]
                n_new = len(after) - after.count(None)
                if n_new and before.count(None) == len(before) and block_size == hash_block_size:
                    # the usual call: blocks hashed for the first time (resolve reads the rest)
                    start = num_cached_blocks - 1 if num_cached_blocks > 0 else 0
                    chain = request.block_hashes[start:num_full_blocks]
                    off, group = num_cached_blocks - start, kv_cache_group_id
                    ops.append((_CACHE, off, group, len(window), *window, *after, *chain))
                    self.op_count += 1
                elif n_new:
                    self._cache_slowly(
                        request, window, before, num_cached_blocks, block_size, kv_cache_group_id
                    )
                self._step_ns += _now() - t + t1 - t0
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
                    self._sync_due = True
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

    def _cache_slowly(
        self,
        request: Any,
        window: list[Any],
        before: list[Any],
        num_cached_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """A cache call over blocks some of which held a hash already (or a
        group whose block size is not the hash block size): read at once."""
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
                if block_size != self.pool.hash_block_size:
                    self._unsupported("a group whose block size is not the hash block size")
                    return
                parent = bytes(request.block_hashes[first - 1])
            self.ops.append(Cache(int(kv_cache_group_id), parent, ids, hashes))
            self.op_count += 1

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
        self._sync_due = True
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
        raw = self.ops[:]
        self.ops.clear()
        self.step += 1
        self.seq += 1
        # a digest asked for now (tools, tests: the engine's own hooks never
        # ask but after a reset, which a sweep rebuilds) is read here
        deferred = self.defer_digest and not (force_digest and not self._sync_due)
        if self.defer_digest and not deferred:
            self.digests_on_engine += 1
        digest = None
        if deferred:  # the operations and the digest: the sender's thread (prepare, catch_up)
            if self._sync_due:  # a reset, a call not followed: every row read again, there
                self._sync_due = False
                self.sweep_due = True
            digest, self.verified = self.verified, None
            ops = raw
        else:
            ops, touched = resolve(raw)
            with self._digest_lock:
                for queued in list(self.inflight):  # not prepared yet: their blocks too
                    touched.extend(resolve(queued.ops)[1])
                if self.sweep is not None or self.sweep_due:  # rows not valid: all read
                    self.sweep, self.sweep_due = None, False
                    touched.append(-2)
                self._update_digest(touched)
            self._sync_due = False
            if force_digest or self.step % self.digest_every == 0:
                digest = Digest(self.op_count, self.digest.value)
        batch = Batch(
            seq=self.seq,
            step=self.step,
            ts=time.time(),
            first_op=self.first_op,
            ops=ops,
            requests=self.requests[:],
            stats=self.stats(),
            drops=self.drops,
            digest=digest,
            boot=self.boot,
        )
        self.requests.clear()
        self.first_op = self.op_count
        if deferred:
            self.inflight.append(batch)
        if not self.offer(batch):
            self.drops += 1
            if deferred:  # never prepared by the sender: its blocks are read here
                batch.ops, touched = resolve(batch.ops)
                if touched:
                    self.pending.append(array("i", touched))
                self.inflight.pop()
        # last: catch_up reads nothing before this batch's blocks are in flight or pending
        self.flushed_ops = self.op_count
        return batch

    def prepare(self, batch: Batch) -> Batch:
        """The sender's thread, before it sends ``batch``: its operations as
        the wire has them (ids and hashes read from the blocks the calls
        gave), and their blocks handed to the digest's catch_up."""
        inflight = self.inflight
        if inflight and inflight[0] is batch:
            try:
                batch.ops, touched = resolve(batch.ops)
            except Exception:  # never expected: the engine's next flush re-reads every block
                touched = [-2]
                self._sync_due = True
            if touched:  # (an array: nothing for the garbage collector to walk)
                self.pending.append(array("i", touched))  # first: catch_up waits for it
            if self._too_far_behind():  # more to read than the pool: read whole, in pieces
                self.pending.clear()
                self.sweep_due = True
            inflight.popleft()
        return batch

    def _too_far_behind(self) -> bool:
        """Whether the blocks of the batches not read yet are more than
        ``max_behind_rows`` (a fraction of the pool: a sweep reads each block
        once, however often it was named), or their arrays more than
        ``MAX_PENDING``."""
        pending = self.pending
        if len(pending) > MAX_PENDING:
            return True
        return len(pending) > MAX_BEHIND and sum(map(len, pending)) > self.max_behind_rows

    def _update_digest(self, touched: list[int]) -> None:
        """The digest brought up to date on this thread (the engine's), over
        the blocks of the batches the sender's thread had not read yet too."""
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
        self.digest_ops = self.op_count

    # ------------------------------------------- the engine's forward pass

    def forward_begins(self) -> None:
        """The scheduler handed a step to the model (its forward pass runs
        now: the engine's thread waits for it, the interpreter is free)."""
        w = self.window
        if w is not None:
            with w:
                self.forward_began = _now()
                self.forwarding = True
                self.forward_passes += 1
                w.notify_all()

    def forward_ends(self) -> None:
        """The engine's thread is back in the scheduler (any hook's entry)."""
        if self.forwarding:
            self.forwarding = False
            self.windows[self.forward_passes % WINDOWS_KEPT] = _now() - self.forward_began

    def may_work(self) -> bool:
        """Whether the sender's thread may work on the pool now without
        taking the interpreter from the engine: its forward pass, or idle."""
        return (
            self.window is None
            or self.forwarding
            or time.monotonic() - self.last_flush >= IDLE_AFTER_S
        )

    def wait_turn(self, timeout: float) -> bool:
        """From the sender's thread: wait (at most ``timeout``) for a forward
        pass of the engine it has not worked in yet, or for idleness; whether
        it may work now."""
        w = self.window
        if w is None:
            return True
        seen = self._turn_seen
        with w:
            w.wait_for(lambda: self.forward_passes != seen, timeout)
        self._turn_seen = self.forward_passes
        self.pace.rested()
        self._plan_window()
        return self.may_work()

    def _plan_window(self) -> None:
        """The sender's plan for the forward pass now running (see
        WINDOWS_KEPT): none until the engine has made as many passes, or
        while it is idle (not in a pass)."""
        shortest = min(self.windows)
        if not self.forwarding or shortest <= 0:
            self.deadline = 0
            return
        self.deadline = self.forward_began + int(shortest * END_SHARE)

    # ------------------------------------------------ the deferred digest

    def catch_up(self) -> bool:
        """From the sender's thread (``defer_digest``): the digest brought up
        to the last flush, if the engine is between batches -- no pool call
        running, none since the flush -- and stays so while the pool is read;
        else nothing changes (False).  The digest taken rides on the next
        batch; a snapshot asked for starts here, at the same boundary.  While
        a sweep rebuilds the digest, each such moment takes it a piece on."""
        if not (self.pending or self.sweep_due or self.sweep is not None):
            return False
        if not self.may_work():  # the engine is working: the digest waits for its next pass
            return False
        with self._digest_lock:
            e0 = self.epoch
            target = self.flushed_ops
            if e0 & 1 or self.op_count != target or self.inflight:
                return False
            pace = self.pace

            def pause() -> bool:  # the engine may want the interpreter: let it in
                pace()
                return self.epoch == e0 and self.may_work()

            if self.sweep_due or self.sweep is not None:
                return self._sweep_on(e0, target, pause)
            if not self._drain(e0, target, pause):
                return False
            self._took(target)
        if self.want_snapshot:
            self._start_capture_between_steps()
        return True

    def _drain(self, e0: int, target: int, pause: Callable[[], bool]) -> bool:
        """catch_up's usual work (``_digest_lock`` held, the engine between
        batches): the pending batches' blocks read into the digest a batch
        at a time, each batch's reading kept once it held (the engine did
        not move during it), so that a sender that falls behind carries on
        where it stopped at the next moment instead of starting again.
        Rows read at different moments make a digest of no one moment --
        but a row that changed since it was read belongs to a block a later
        batch names, or to one next to such a block, which the reading of
        that batch re-reads: once no batch is pending, at a moment, every
        row is the block as it is (blockpool/mirror/digest.py).  True once
        none is left."""
        pending = self.pending
        deadline = self.deadline
        first = True
        while pending:
            part = pending[0]
            t = _now()
            if deadline and not first and t + len(part) * self.read_ns_per_block > deadline:
                return False  # would end after the engine is back: at its next pass
            first = False
            try:
                staged = self.digest.stage(part, pause)
            except Exception:  # the engine moved (Interrupted), or the pool changed under it
                staged = None
            if staged is None or self.epoch != e0 or self.op_count != target:
                self.digests_discarded += 1
                if not self.forwarding:
                    self.windows_overrun += 1
                return False
            self.digest.commit(staged)
            del pending[0]
            if len(part) >= 64:  # (a small batch's time is mostly fixed costs)
                spent = (_now() - t) / len(part)
                self.read_ns_per_block += (spent - self.read_ns_per_block) * 0.25
            if pending and not pause():  # the engine came back: the rest at the next moment
                return False
        return True

    def _took(self, target: int) -> None:
        self.digest_ops = target
        self.verified = Digest(target, self.digest.value)
        self.digests_taken += 1

    def _new_sweep(self) -> None:
        """Every row invalid: the blocks named before now are moot."""
        self.sweep_due = False  # (first: a flag set from now on starts another)
        self.sweep = DigestSweep(self.digest)
        self.sweeps += 1
        self.pending.clear()

    def _sweep_on(self, e0: int, target: int, pause: Callable[[], bool]) -> bool:
        """catch_up while a sweep rebuilds the digest (``_digest_lock`` held,
        the engine between batches): the blocks named since the last moment
        invalidated, a batch's at a time (told again if the engine moved
        meanwhile: invalidating twice changes nothing), then rows read a
        piece at a time -- as planned for the forward pass (``deadline``):
        the first batch and the first piece always, no other begun that is
        expected to end after the engine is back."""
        pending = self.pending
        if self.sweep_due or self.sweep is None:
            self._new_sweep()
        sweep = self.sweep
        assert sweep is not None
        deadline = self.deadline
        first = True
        while pending:
            part = pending[0]
            t = _now()
            if deadline and not first and t + len(part) * self.named_ns_per_block > deadline:
                return False  # at the engine's next pass
            first = False
            try:
                sweep.named(part, pause)
            except Exception:  # the pool changed under it, or the engine came back:
                return False  # told again at the next moment
            if self.epoch != e0:
                return False
            del pending[0]
            if len(part) >= 64:
                spent = (_now() - t) / len(part)
                self.named_ns_per_block += (spent - self.named_ns_per_block) * 0.25
            if not self.may_work():
                return False

        def budget() -> int:  # rows the next piece may have
            if not deadline:
                return PIECE
            return int((deadline - _now()) / self.sweep_ns_per_row)

        t, rows, lost = _now(), sweep.rows_read, sweep.pieces_discarded
        done = sweep.read(lambda: self.epoch != e0, pause, budget)
        rows = sweep.rows_read - rows
        if rows >= 64 and sweep.pieces_discarded == lost:
            spent = (_now() - t) / rows
            self.sweep_ns_per_row += (spent - self.sweep_ns_per_row) * 0.25
        if not done:
            return False
        self.digest.total = sweep.total()
        self.sweep = None
        self.sweeps_finished += 1
        self._took(target)
        return True

    def latest_digest(self) -> Digest | None:
        """The newest digest and the boundary it is of (for a beat)."""
        with self._digest_lock:
            if self.digest_ops != self.flushed_ops or self.pending or self.inflight:
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
        if self.ops or self.digest_ops != self.op_count:
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
            touched = [i for queued in list(self.inflight) for i in resolve(queued.ops)[1]]
            if self.sweep is not None or self.sweep_due:  # rows not valid: all read here
                self.sweep, self.sweep_due = None, False
                touched.append(-2)
            self._update_digest(touched)
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
