"""Following a block pool: every call that changes it, recorded as it happens.

``PoolFollower`` wraps the pool *object's* methods (its instance attributes:
vLLM's classes and files are left as they are: blockpool_vllm/pool_hooks.py)
so that each call is kept as one operation of the mirror protocol
(blockpool/mirror/protocol.py; the usual ones read as such off the engine's
thread, blockpool_vllm/call_records.py), and ``flush`` hands the operations
since the last flush to a sender as one ``Batch``.  Works on vLLM's
BlockPool (0.16 and >= 0.24) and on blockpool's, which is how it is tested
without vLLM.

Cost on the engine's thread, per scheduler step, is O(what the step did):
an append per pool call, never a walk over the pool.  The digest over the
blocks the step named (``PoolDigest``) is brought up to date at ``flush``,
or -- ``defer_digest`` -- off the engine's thread: ``catch_up``, from the
sender's thread, finds a moment the engine stands still between batches
(in its forward pass, blockpool_vllm/forward_pass.py, or idle) and has the
``DigestReader`` (blockpool_vllm/digest_reader.py) read the pool then; the
digest taken rides on the next batch (or beat) for the boundary it is of.
The engine's thread never reads the pool for it.  A snapshot is
copied a slice per step (``Capture``), and by the sender's thread while the
engine is idle.  Nothing here blocks on I/O: a full sender queue drops the
batch and counts it (the mirror sees the gap and resyncs).  The time each
step spent here is kept per batch, for one batch in ``TIME_EVERY``
(``cost_quantiles``: p50, p99, max).
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
from blockpool.mirror.protocol import (
    Batch,
    Digest,
    DigestReading,
    Record,
    Snapshot,
    Unsupported,
)
from blockpool_vllm.call_records import resolve
from blockpool_vllm.capture import Capture
from blockpool_vllm.digest_reader import DigestReader
from blockpool_vllm.forward_pass import IDLE_AFTER_S, ForwardPasses
from blockpool_vllm.pool_hooks import hook_pool

COSTS_KEPT = 2048  # the last timed batches' costs, for the quantiles
# one batch in this many has its time taken (its calls' clocks read: ~4 reads
# a pool call, ~35 calls a step -- bench/gpu_scale/forked.py --per-method: 6-17
# µs a step); odd, so that a step's two batches (its schedule's, its output's)
# are each timed in turn
TIME_EVERY = 7
CAPTURE_BUDGET_S = 0.0008  # a step's share of copying a snapshot


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
        pipelined: bool = False,
        time_every: int = TIME_EVERY,
    ) -> None:
        self.pool = pool
        self.defer_digest = defer_digest
        # windowed: the scheduler's hooks say when the engine is in its forward
        # pass (``passes.begins``, ``passes.ends``): the sender's thread works
        # on the pool then, and lets go of it the moment the engine comes back
        # pipelined: the engine schedules a step while the one before runs
        # (vLLM's AsyncScheduler), its passes planned by their ends
        self.passes = ForwardPasses(windowed, work_left=self._work_left, pipelined=pipelined)
        self.offer = offer  # hands a batch to the sender; False: dropped
        self.digest_every = max(1, digest_every)
        self.stats = stats or (lambda: (0, 0, 0))
        self.boot = boot
        # the calls since the last flush: typed operations, or (for the usual
        # calls) what ``resolve`` turns into them -- the blocks, not their ids
        self.ops: list[Any] = []
        self.requests: list[Record] = []
        # a batch's reset or unsupported call: its digest is taken at its flush
        self.sync_due = False
        self.op_count = 0  # operations recorded since the start
        self.first_op = 0  # the index of self.ops[0]
        self.seq = 0  # batches made
        self.step = 0
        self.drops = 0
        self.epoch = 0  # odd while a pool call runs
        self.problems: list[str] = []
        # the time spent recording and flushing (not the pool's own calls), taken
        # for one batch in ``time_every`` (``timed``: the calls until the next batch)
        self.time_every = max(1, time_every)
        self.timed = True
        self.cost_ns = 0  # the timed batches' in all
        self.step_ns = 0  # the timed batch's so far
        self.costs = array("d", bytes(8 * COSTS_KEPT))  # µs per timed batch, a ring
        self.costs_kept = 0  # batches timed so far (figures put in the ring)
        self.cost_max_us = 0.0
        self.digest = PoolDigest(pool)  # O(pool), once, at start
        self.digest_ops = 0  # the digest is of the pool after this many operations
        self.flushed_ops = 0  # operations up to the last flush (a batch boundary)
        # deferred: the digest read on the sender's thread
        self.reader = DigestReader(self.digest, self.passes)
        self.inflight: deque[Batch] = deque()  # deferred: offered, not prepared by the sender yet
        self.digests_on_engine = 0  # deferred, yet taken here (asked for: force_digest)
        self._digest_lock = threading.Lock()  # catch_up vs. the engine's own update
        # snapshots: asked for by the sender (any thread), copied here
        self.want_snapshot = False
        self.capture: Capture | None = None
        self.captured: Capture | None = None  # a finished copy, for the sender
        self.captures_abandoned = 0
        self.capture_lock = threading.Lock()  # the sender copying while the engine is idle
        hook_pool(self)

    def _work_left(self) -> bool:
        """The plugin's thread, at the end of its turn: work it has left (the
        digest behind, a snapshot), for which it is woken at every forward
        pass until done (blockpool_vllm/forward_pass.py, ``WAKE_EVERY_NS``)."""
        return (
            self.reader.due
            or self.want_snapshot
            or self.capture is not None
            or self.captured is not None
        )

    def unsupported(self, what: str) -> None:
        """A pool call the mirror does not model: said in the handshake, a
        wire record of it, and the digest read again whole at the flush."""
        if what not in self.problems:
            self.problems.append(what)
        self.abandon_capture()
        self.ops.append(Unsupported(what[:2000]))
        self.sync_due = True
        self.op_count += 1

    def abandon_capture(self) -> None:
        """The pool changed as a whole: a copy in progress is of no moment."""
        if self.capture is not None:
            with self.capture_lock:
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
        timed = self.timed
        t = _now() if timed else 0
        batch = None
        if self.ops or self.requests or force_digest:
            batch = self._batch(force_digest)
        self._capture_step()
        self.passes.last_flush = time.monotonic()
        if not timed:
            if batch is not None:
                self.timed = self.step % self.time_every == 0
            return batch
        spent = self.step_ns + _now() - t
        if batch is None:  # (its time is the next batch's: one figure a batch, none lost)
            self.step_ns = spent
            return None
        self.step_ns = 0
        self.cost_ns += spent
        us = spent / 1000.0
        self.costs[self.costs_kept % COSTS_KEPT] = us
        self.costs_kept += 1
        if us > self.cost_max_us:
            self.cost_max_us = us
        self.timed = self.step % self.time_every == 0
        return batch

    def _batch(self, force_digest: bool) -> Batch:
        raw, self.ops = self.ops, []  # (taken whole: the pool's hooks keep the next in a new one)
        self.step += 1
        self.seq += 1
        # a digest asked for now (tools, tests: the engine's own hooks never
        # ask but after a reset, which a sweep rebuilds) is read here
        deferred = self.defer_digest and not (force_digest and not self.sync_due)
        if self.defer_digest and not deferred:
            self.digests_on_engine += 1
        digest = None
        if deferred:  # the operations and the digest: the sender's thread (prepare, catch_up)
            if self.sync_due:  # a reset, a call not followed: every row read again, there
                self.sync_due = False
                self.reader.sweep_due = True
            digest, self.reader.verified = self.reader.verified, None
            ops = raw
        else:
            ops, touched = resolve(raw)
            with self._digest_lock:
                for queued in list(self.inflight):  # not prepared yet: their blocks too
                    touched.extend(resolve(queued.ops)[1])
                if self.reader.sweep is not None or self.reader.sweep_due:  # rows not valid
                    self.reader.sweep, self.reader.sweep_due = None, False  # all read
                    touched.append(-2)
                self._update_digest(touched)
            self.sync_due = False
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
            if deferred:  # never prepared by the sender: the digest is rebuilt whole, by
                self.inflight.pop()  # its thread -- the reader's lists are that thread's
                self.reader.sweep_due = True  # alone (a block named from here while it reads
                # was lost: a part read before this batch's calls, done with after them)
        # last: catch_up reads nothing before this batch's blocks are in flight or pending
        self.flushed_ops = self.op_count
        return batch

    def prepare(self, batch: Batch, encoded: bool = False) -> Batch:
        """The sender's thread, before it sends ``batch``: its operations as
        the wire has them (ids and hashes read from the blocks the calls
        gave; ``encoded``: as their bytes, see ``resolve``), and their
        blocks handed to the digest's catch_up."""
        inflight = self.inflight
        if inflight and inflight[0] is batch:
            try:
                batch.ops, touched = resolve(batch.ops, self.passes.pace, encoded)
            except Exception:  # never expected: the engine's next flush re-reads every block
                touched = [-2]
                self.sync_due = True
            self.reader.add(touched)  # first: catch_up waits for it
            inflight.popleft()
        return batch

    def prepare_encoded(self, batch: Batch) -> Batch:
        """``prepare`` for the sender: the operations encoded one by one."""
        return self.prepare(batch, True)

    def _update_digest(self, touched: list[int]) -> None:
        """The digest brought up to date on this thread (the engine's), over
        the blocks of the batches the sender's thread had not read yet too."""
        touched.extend(self.reader.take_pending())
        if touched:
            if -2 in touched:  # something not followed: every block re-read
                self.digest.refresh()
            elif -1 in touched:  # a reset: the blocks that held a hash (and the rest)
                self.digest.update([i for i in touched if i > 0])
                self.digest.after_reset()  # (after: update reads the old links)
            else:
                self.digest.update(touched)
        self.digest_ops = self.op_count

    # ------------------------------------------------ the deferred digest

    def catch_up(self) -> bool:
        """From the sender's thread (``defer_digest``): the digest brought up
        to the last flush, if the engine is between batches -- no pool call
        running, none since the flush -- and stays so while the pool is read
        (blockpool_vllm/digest_reader.py); else nothing changes (False).  The
        digest taken rides on the next batch; a snapshot asked for starts
        here, at the same boundary."""
        reader, passes = self.reader, self.passes
        if not reader.due:
            return False
        if not passes.may_work():  # the engine is working: the digest waits for its next pass
            return False
        with self._digest_lock:
            e0 = self.epoch
            target = self.flushed_ops
            if e0 & 1 or self.op_count != target or self.inflight:
                return False
            pace = passes.pace

            def pause() -> bool:  # the engine may want the interpreter: let it in
                pace()
                return self.epoch == e0 and passes.may_work()

            def moved() -> bool:
                return self.epoch != e0 or self.op_count != target

            if not reader.read(moved, pause):
                return False
            self.digest_ops = target
            reader.took(target)
        if self.want_snapshot:
            self._start_capture_between_steps()
        return True

    def latest_digest(self) -> Digest | None:
        """The newest digest and the boundary it is of (for a beat)."""
        with self._digest_lock:
            if self.digest_ops != self.flushed_ops or self.reader.pending or self.inflight:
                return None  # the engine moved since: the next catch_up has it
            return Digest(self.digest_ops, self.digest.value)

    def reading(self) -> DigestReading | None:
        """How far the deferred digest is behind, for the handshake and a
        beat (the sender's thread: the one that reads); None when the digest
        is read on the engine's thread."""
        if not self.defer_digest:
            return None
        r = self.reader
        sweep = r.sweep
        if sweep is not None:
            left: int | None = max(0, sweep.left)
        else:
            left = self.digest.n if r.sweep_due else None
        return DigestReading(
            behind=sum(map(len, list(r.pending))),
            sweep_left=left,
            window_us=self.passes.shortest_us(),
            taken=r.digests_taken,
            discarded=r.digests_discarded,
            stopped=r.readings_stopped,
            overrun=r.windows_overrun,
            planned_too_long=self.passes.tokens_misses,
        )

    def cost_quantiles(self) -> tuple[float, float, float] | None:
        """The follower's time on the engine's thread per batch (µs; a step
        flushes one at its schedule and one at its output, a flush with
        nothing to send adds to the next), of the batches timed (one in
        ``time_every``): p50 and p99 of the last ``COSTS_KEPT``, the maximum
        since the start."""
        n = min(self.costs_kept, COSTS_KEPT)
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
                with self.capture_lock:
                    self.capture = cap
                    self.want_snapshot = False
        cap = self.capture
        if cap is not None:
            with self.capture_lock:
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
            reader = self.reader
            if reader.sweep is not None or reader.sweep_due:  # rows not valid: all read here
                reader.sweep, reader.sweep_due = None, False
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
        if time.monotonic() - self.passes.last_flush < IDLE_AFTER_S or self.epoch & 1:
            return None
        if (
            self.capture is None
            and self.captured is None
            and not self._start_capture_between_steps()
        ):
            return None
        with self.capture_lock:
            cap = self.capture
            if cap is not None:
                cap.advance(0.002)
                if cap.done:
                    self.captured, self.capture = cap, None
        return None

    def _start_capture_between_steps(self) -> bool:
        """From the sender's thread: a copy started now, if no pool call runs
        (one that begins meanwhile may not have seen it: undone)."""
        with self._digest_lock, self.capture_lock:
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
