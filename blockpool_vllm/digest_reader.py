"""The follower's digest read off the engine's thread (``defer_digest``).

Each batch the sender prepares hands the blocks its calls named to
``DigestReader.add``; at a moment the engine stands still between batches
(the follower's ``catch_up`` finds one, in a forward pass or while the
engine is idle) ``read`` brings the digest up to the last batch:

* usually a batch's blocks at a time (``PoolDigest.stage``), each batch's
  reading kept once the engine did not move during it, so that a reader
  that falls behind carries on where it stopped at the next moment.  Rows
  read at different moments make a digest of no one moment -- but a row
  that changed since it was read belongs to a block a later batch names,
  or to one next to such a block, which the reading of that batch re-reads
  (blockpool/mirror/digest.py): once no batch is pending, at a moment,
  every row is the block as it is;
* when more blocks are pending than a share of the pool (a sweep reads
  each block once, however often it was named), or after a reset or a
  call not followed, the digest is rebuilt in pieces instead
  (blockpool/mirror/digest_sweep.py).

Both are planned for the forward pass running (blockpool_vllm/forward_pass.py):
as many blocks are read (or named, for a sweep) as are expected -- their
measured time a block -- to be read before the plan's deadline, a batch's
blocks in pieces if need be; at least a few at each moment, for progress.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from time import perf_counter_ns as _now

from blockpool.mirror.digest import PAUSE_EVERY, Interrupted, PoolDigest, Staged
from blockpool.mirror.digest_sweep import PIECE, DigestSweep
from blockpool.mirror.protocol import Digest
from blockpool_vllm.forward_pass import ForwardPasses

# batches whose blocks have not been read yet: up to this many, their blocks
# are not even counted (a reader a few passes behind catches up); past it, a
# batch's blocks join the last part (read as one: as exact, a reading takes
# the blocks named since the last however many batches named them) -- a part
# a batch would be an object the garbage collector counts, thousands of
# them while an engine too busy to be read works (measured: the engine's
# young collections doubled, each walking its young requests' token lists)
MAX_BEHIND = 16
# blocks pending (named by batches the digest has not read yet), at most: a
# fraction of the pool -- beyond, a sweep reads every block once instead
BEHIND_FRACTION = 4
MIN_BEHIND_ROWS = 4096
# batches whose blocks the sweep has not been told of, at most: beyond, it
# starts again (their ids are not kept without bound)
MAX_PENDING = 4096
# blocks read at least at a moment of a planned forward pass (progress); a
# part longer than the time left is read in pieces, each at a moment of its
# own -- as exact as whole parts: what a reading takes is closed, and every
# block changed after it was read is named by a later part
# (blockpool/mirror/digest.py, ``PoolDigest.stage``)
MIN_PIECE = PAUSE_EVERY  # 64 (a reading stopped in time keeps as many: _in_time)
# ... and at most this many in one piece while a pass is planned: a reading
# the engine interrupts (its pass shorter than planned, the reader slower)
# is thrown away, and loses no more than this
MAX_PIECE = 512


class DigestReader:
    def __init__(self, digest: PoolDigest, passes: ForwardPasses) -> None:
        self.digest = digest
        self.passes = passes
        self.pending: list[array[int]] = []  # batches' blocks not in the digest yet
        # the blocks in a pending part: a block a later batch names again while
        # it waits is not added again -- read once, after every change those
        # batches named (a reader behind reads a fifth fewer blocks 16 batches
        # behind on the GPU-scale bench, more the further behind it is)
        self.waiting = bytearray(digest.n)
        # beyond this many blocks pending, the digest is rebuilt by a sweep
        self.max_behind_rows = max(MIN_BEHIND_ROWS, digest.n // BEHIND_FRACTION)
        self.verified: Digest | None = None  # the last taken, for the next batch
        # the digest rebuilt in pieces after the reader fell behind, a reset,
        # or a call not followed
        self.sweep: DigestSweep | None = None
        self.sweep_due = False  # set by the engine's thread, acted on here
        self.sweeps = 0  # sweeps started
        self.sweeps_finished = 0
        self.digests_taken = 0
        self.digests_discarded = 0  # batches' readings thrown away (the engine moved)
        self.windows_overrun = 0  # ... of which still running when the engine came back
        # readings stopped at the plan's deadline, what they read kept (the
        # blocks left read first at the next moment)
        self.readings_stopped = 0
        # speeds, as last measured: reading (a batch's blocks, a sweep's rows)
        # and invalidating (a sweep told of a batch's blocks)
        self.read_ns_per_block = 2_000.0
        self.sweep_ns_per_row = 2_000.0
        self.named_ns_per_block = 1_000.0

    @property
    def due(self) -> bool:
        """Whether there is anything to read."""
        return bool(self.pending) or self.sweep_due or self.sweep is not None

    def add(self, touched: list[int]) -> None:
        """A prepared batch's blocks (-1: a reset, -2: a call not followed),
        those not waiting already."""
        if touched:
            waiting = self.waiting
            fresh = array("i")  # (an array: nothing for the garbage collector to walk)
            keep = fresh.append
            for i in touched:
                if i <= 0:
                    keep(i)  # a reset, a call not followed (the null block: ignored)
                elif not waiting[i]:
                    waiting[i] = 1
                    keep(i)
            if fresh:
                pending = self.pending
                if len(pending) > MAX_BEHIND:  # far behind: one more part, no more arrays
                    pending[-1].extend(fresh)
                else:
                    pending.append(fresh)
        if self.too_far_behind():  # more to read than the pool: read whole, in pieces
            self.clear_pending()
            self.sweep_due = True

    def take_pending(self) -> list[int]:
        """The blocks of every pending part (in order), none pending since."""
        ids = [i for part in self.pending for i in part]
        self.clear_pending()
        return ids

    def clear_pending(self) -> None:
        """None pending (their blocks moot: a sweep reads every row)."""
        self.pending.clear()
        self.waiting = bytearray(len(self.waiting))

    def too_far_behind(self) -> bool:
        """Whether the blocks of the batches not read yet are more than
        ``max_behind_rows`` (a fraction of the pool: a sweep reads each block
        once, however often it was named), or their arrays more than
        ``MAX_PENDING``."""
        pending = self.pending
        if len(pending) > MAX_PENDING:
            return True
        return len(pending) > MAX_BEHIND and sum(map(len, pending)) > self.max_behind_rows

    def read(self, moved: Callable[[], bool], pause: Callable[[], bool]) -> bool:
        """At a moment the engine stands still (``moved``: it has since;
        ``pause``: let it in, and whether to go on): the digest brought up to
        the last batch (True), or as far as the moment allowed (False)."""
        if self.sweep_due or self.sweep is not None:
            return self._sweep_on(moved, pause)
        return self._drain(moved, pause)

    def took(self, target: int) -> None:
        """The digest is of the boundary after ``target`` operations."""
        self.verified = Digest(target, self.digest.value)
        self.digests_taken += 1

    def _fit(self, part: array[int], ns_per_block: float, first: bool) -> int:
        """How many of ``part``'s blocks to read now, as planned: all of them
        with no plan (an idle engine); else as many as are expected to be
        read before the deadline, at most ``MAX_PIECE`` -- at least
        ``MIN_PIECE`` for the first of a moment (progress, however short the
        passes), none (0) for a later one that would not read ``MIN_PIECE``."""
        deadline = self.passes.deadline
        if not deadline:
            return len(part)
        fit = min(MAX_PIECE, int((deadline - _now()) / max(ns_per_block, 1.0)))
        if fit < MIN_PIECE:
            return min(len(part), MIN_PIECE) if first else 0
        return min(len(part), fit)

    def _drain(self, moved: Callable[[], bool], pause: Callable[[], bool]) -> bool:
        pending = self.pending
        first = True
        in_time = self._in_time(pause)
        while pending:
            part = pending[0]
            take = self._fit(part, self.read_ns_per_block, first)
            if not take:
                return False  # would end after the engine is back: at its next pass
            first = False
            joined = 1
            if take < len(part):  # a part read in pieces: each the blocks it names then
                part = part[:take]
            elif len(pending) > 1 and self.passes.deadline:
                part, joined = self._joined(part)
                take = len(part)
            t = _now()
            left: list[int] | None = None
            try:
                staged: Staged | None = self.digest.stage(part, in_time)
            except Interrupted as stop:  # out of time (or the engine moved: below)
                staged, left = stop.staged, stop.left
            except Exception:  # the pool changed under it
                staged = None
            if staged is None or moved():
                self.digests_discarded += 1
                if not self.passes.forwarding:
                    self.windows_overrun += 1
                return False
            self.digest.commit(staged)
            self._done_with(take, joined)
            if left is not None:  # stopped in time: the rest first at the next moment
                self.readings_stopped += 1
                self._first(left)
                return False
            if take >= 64:  # (a small reading's time is mostly fixed costs)
                spent = (_now() - t) / take
                self.read_ns_per_block += (spent - self.read_ns_per_block) * 0.25
            if pending and not pause():  # the engine came back: the rest at the next moment
                return False
        return True

    def _in_time(self, pause: Callable[[], bool]) -> Callable[[], bool]:
        """``pause``, and past the plan's deadline a stop: a reading found
        still going then keeps what it read, the rest read at the next
        moment (how many blocks a batch's reading takes -- those it names,
        their neighbours, the blocks after them under a key -- is not known
        before it is read: a prefix hit names a block in the queue's middle,
        two neighbours read with it; thrown away, as it was, a reading too
        long for the pass was begun again at every pass and never kept --
        GPU-scale bench, sync: 0-112 kept of 672-790 a run).  A reading
        first looks after ``PAUSE_EVERY`` blocks: one stopped keeps
        ``MIN_PIECE`` at least (progress, however late the moment)."""
        overdue = self.passes.overdue

        def in_time() -> bool:
            return pause() and not overdue()

        return in_time

    def _first(self, left: list[int]) -> None:
        """A stopped reading's blocks left (every one not pending already),
        the first to read at the next moment."""
        waiting = self.waiting
        part = array("i")
        for i in left:
            if not waiting[i]:
                waiting[i] = 1
                part.append(i)
        if part:
            self.pending.insert(0, part)

    def _joined(self, part: array[int]) -> tuple[array[int], int]:
        """``part`` (the first pending batch, whole) and the whole batches
        after it that the time planned leaves room for, up to ``MAX_PIECE``
        blocks, as one reading -- its fixed costs paid once, and a block
        several of them name read once (a reader behind reads a decoding
        engine's small batches, which name the same blocks again) -- and how
        many batches it joined.  As exact as batch by batch: a reading takes
        the blocks named since the last, however many batches named them
        (``PoolDigest.stage``)."""
        left_ns = self.passes.deadline - _now()
        room = min(MAX_PIECE, int(left_ns / max(self.read_ns_per_block, 1.0)))
        batches = self.pending
        n = len(part)
        joined = 1
        while joined < len(batches) and n + len(batches[joined]) <= room:
            n += len(batches[joined])
            joined += 1
        if joined == 1:
            return part, 1
        whole = array("i", part)
        for more in batches[1:joined]:
            whole.extend(more)
        return whole, joined

    def _done_with(self, taken: int, parts: int = 1) -> None:
        """The first ``taken`` blocks of the first ``parts`` pending parts
        (all of them, for more than one) are read: waiting no more."""
        pending, waiting = self.pending, self.waiting
        for part in pending[:parts]:
            for i in part[:taken] if parts == 1 else part:
                if i > 0:
                    waiting[i] = 0
        if parts > 1 or taken >= len(pending[0]):
            del pending[:parts]
        else:
            pending[0] = pending[0][taken:]

    def new_sweep(self) -> None:
        """Every row invalid: the blocks named before now are moot."""
        self.sweep_due = False  # (first: a flag set from now on starts another)
        self.sweep = DigestSweep(self.digest)
        self.sweeps += 1
        self.clear_pending()

    def _sweep_on(self, moved: Callable[[], bool], pause: Callable[[], bool]) -> bool:
        """While a sweep rebuilds the digest: the blocks named since the last
        moment invalidated, a batch's at a time (told again if the engine
        moved meanwhile: invalidating twice changes nothing), then rows read
        a piece at a time, as planned."""
        pending = self.pending
        if self.sweep_due or self.sweep is None:
            self.new_sweep()
        sweep = self.sweep
        assert sweep is not None
        passes = self.passes
        deadline = passes.deadline
        first = True
        while pending:
            part = pending[0]
            if -1 in part or -2 in part:  # a reset, a call not followed: from scratch
                self.new_sweep()
                return False
            take = self._fit(part, self.named_ns_per_block, first)
            if not take:
                return False  # at the engine's next pass
            first = False
            if take < len(part):  # (naming a block twice changes nothing)
                part = part[:take]
            t = _now()
            try:
                sweep.named(part, pause)
            except Exception:  # the pool changed under it, or the engine came back:
                return False  # told again at the next moment
            if moved():
                return False
            self._done_with(take)
            if take >= 64:
                spent = (_now() - t) / take
                self.named_ns_per_block += (spent - self.named_ns_per_block) * 0.25
            if not passes.may_work():
                return False

        def budget() -> int:  # rows the next piece may have
            if not deadline:
                return PIECE
            return int((deadline - _now()) / max(self.sweep_ns_per_row, 1.0))

        t, rows, lost = _now(), sweep.rows_read, sweep.pieces_discarded
        done = sweep.read(moved, pause, budget)
        rows = sweep.rows_read - rows
        if rows >= 64 and sweep.pieces_discarded == lost:
            spent = (_now() - t) / rows
            self.sweep_ns_per_row += (spent - self.sweep_ns_per_row) * 0.25
        if not done:
            return False
        self.digest.total = sweep.total()
        self.sweep = None
        self.sweeps_finished += 1
        return True
