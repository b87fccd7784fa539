"""A pool's digest rebuilt in pieces while the pool keeps changing.

``PoolDigest.stage`` brings a digest up to date from the blocks the pool
calls since the last reading named -- all of them read at one moment the
pool stands still.  When those are too many for one such moment (the
reader fell behind), or the digest's rows are no longer the pool's (a
reset, a call not followed), ``DigestSweep`` rebuilds it over many moments
instead, each as short as the reader likes:

* every row starts *invalid*; a moment's reading makes the rows it read
  valid, and each valid row is the block as it was at the last moment;
* at each moment, before reading, the blocks named since the previous one
  are invalidated, with every valid block whose row a call can have
  changed through them: the blocks their valid rows linked to, the valid
  blocks whose rows link to them (in the queue or, for a hash several
  blocks hold, in the map: ``back_next``, ``back_prev``, ``back_link``),
  and their queue neighbours now.  That is a few reads per named block,
  never the named blocks' whole rows (a block's place in the map is a link
  to the block before it, digest.py, so that leaving a key changes the one
  block after it);
* then invalid rows are read, a piece at a time (``PIECE`` blocks, or
  fewer: a reader that knows when the owner is back says how many fit);
  a piece the pool moved during is thrown away, the pieces before it
  kept.  A row is read straight into the digest's columns: an invalid
  row's are nobody's, so a piece thrown away leaves nothing to undo;
* once no row is invalid the digest is whole again: of the pool at the
  last moment.

So a reader that falls behind never needs one long moment, and the pool's
owner never reads anything (blockpool_vllm's follower, off vLLM's thread).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable

from blockpool.mirror.digest import LINK, MASK, NEXT, PREV, ROW, Interrupted, PoolDigest

PIECE = 256  # rows read between two looks at whether the pool moved
NAMED_PAUSE_EVERY = 256  # blocks named between two calls of ``named``'s pause
_NONE = -3


class DigestSweep:
    def __init__(self, digest: PoolDigest) -> None:
        self.digest = digest
        n = digest.n
        self.n = n
        self.valid = bytearray(n)
        self.valid_sum = 0  # the valid rows' values
        self.pos = 1  # rows from here on not read yet (all invalid)
        self.again: set[int] = set()  # rows before ``pos`` invalidated since
        self.back_next = array("i", [_NONE]) * n  # t -> the valid row whose next is t
        self.back_prev = array("i", [_NONE]) * n
        self.back_link = array("i", [_NONE]) * n  # t -> the valid row whose map link is t
        self.rows_read = 0
        self.moments = 0  # moments it was told of (``named``)
        self.pieces_discarded = 0  # pieces the pool moved during

    @property
    def left(self) -> int:
        """Rows still invalid."""
        return self.n - self.pos + len(self.again)

    @property
    def done(self) -> bool:
        return self.pos >= self.n and not self.again

    def _invalidate(self, bid: int) -> None:
        if bid <= 0 or not self.valid[bid]:
            return
        rows = self.digest.rows
        i = bid * ROW
        self.valid[bid] = 0
        self.valid_sum -= rows[i]
        t = rows[i + NEXT]
        if t > 0 and self.back_next[t] == bid:
            self.back_next[t] = _NONE
        t = rows[i + PREV]
        if t > 0 and self.back_prev[t] == bid:
            self.back_prev[t] = _NONE
        t = rows[i + LINK]
        if t > 0 and self.back_link[t] == bid:
            self.back_link[t] = _NONE
        self.again.add(bid)

    def named(self, ids: Iterable[int], pause: Callable[[], bool] | None = None) -> None:
        """The blocks named by the pool's calls since the last moment
        (read now, the pool standing still): invalidated with every valid
        row those calls may have changed (see the module doc).  ``pause``,
        called every ``NAMED_PAUSE_EVERY`` blocks, says whether to go on (else
        ``Interrupted``: the same blocks named again later change nothing
        more)."""
        d = self.digest
        blocks = d.pool.blocks
        n = self.n
        valid, rows = self.valid, d.rows
        back_next, back_prev, back_link = self.back_next, self.back_prev, self.back_link
        out = self._invalidate
        self.moments += 1
        left = NAMED_PAUSE_EVERY
        for y in ids:
            if not 0 < y < n:
                continue
            if pause is not None:
                left -= 1
                if not left:
                    left = NAMED_PAUSE_EVERY
                    if not pause():
                        raise Interrupted
            if valid[y]:
                i = y * ROW
                out(rows[i + PREV])
                out(rows[i + NEXT])
                out(y)
            t = back_next[y]
            if t > 0:
                out(t)
            t = back_prev[y]
            if t > 0:
                out(t)
            t = back_link[y]
            if t > 0:
                out(t)
            b = blocks[y]
            p, x = b.prev_free_block, b.next_free_block
            if p is not None:
                out(p.block_id)
            if x is not None:
                out(x.block_id)

    def read(
        self,
        moved: Callable[[], bool],
        pause: Callable[[], bool],
        budget: Callable[[], int] | None = None,
    ) -> bool:
        """Read invalid rows, a piece at a time, until none is left (True),
        ``moved`` says the pool moved while a piece was read (that piece
        thrown away, False), ``pause``, called between pieces, says to stop
        (False) or ``budget`` does: asked before every piece but the first,
        it says how many rows the next may have (at most ``PIECE``; 0: stop
        here, every piece read so far kept, False) -- a reader that knows
        when the pool's owner comes back begins no piece it cannot finish."""
        size = PIECE
        while not self.done:
            ids: list[int] = []
            again = self.again
            while again and len(ids) < size:
                ids.append(again.pop())
            taken_again = list(ids)
            start = self.pos
            if len(ids) < size:
                stop = min(self.n, start + size - len(ids))
                ids.extend(range(start, stop))
            else:
                stop = start
            try:
                got = self._read_piece(ids, pause)
            except Interrupted:  # the engine came back: this piece is read again later
                again.update(taken_again)
                self.pieces_discarded += 1
                return False
            if moved():
                again.update(taken_again)  # thrown away: invalid still
                self.pieces_discarded += 1
                return False
            self._commit(ids, got)
            self.pos = stop
            if self.done or not pause():
                break
            if budget is not None:
                size = min(PIECE, budget())
                if size <= 0:
                    return False
        return self.done

    def _read_piece(self, ids: list[int], pause: Callable[[], bool]) -> int:
        """Invalid rows read straight into the digest's columns (an invalid
        row's columns are nobody's until it is valid, so a piece thrown away
        leaves nothing to undo); the sum of their values."""
        return self.digest.read_into(ids, pause)[0]

    def _commit(self, ids: list[int], got: int) -> None:
        """The rows ``_read_piece`` read are valid: their links kept."""
        rows = self.digest.rows
        valid, back_next, back_prev = self.valid, self.back_next, self.back_prev
        back_link = self.back_link
        for bid in ids:
            valid[bid] = 1
            i = bid * ROW
            t = rows[i + NEXT]
            if t > 0:
                back_next[t] = bid
            t = rows[i + PREV]
            if t > 0:
                back_prev[t] = bid
            t = rows[i + LINK]
            if t > 0:
                back_link[t] = bid
        self.valid_sum += got
        self.rows_read += len(ids)

    def total(self) -> int:
        """The digest's total once ``done`` (every row valid)."""
        return (self.n + self.valid_sum) & MASK
