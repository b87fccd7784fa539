"""Where freed blocks enter the free queue, and the queue stamps that follow.

Two orders:

``"append_all"`` (vLLM 0.16.0, the default)
    every block whose ref count reaches 0 goes to the tail, in the order the
    caller gives.
``"uncached_first"`` (vLLM >= 0.24)
    the blocks reaching 0 are split: those without a hash (all of them when
    caching is off) go to the HEAD, keeping their given order (the first
    listed becomes the new head), the hashed ones to the tail.  A hashless
    block can never be a prefix hit, so it is reused before any cached one.

Queue stamps (``stamp_freed``) are numbers such that the free blocks sorted
by stamp are the queue from head to tail: tail entries take increasing
stamps above every stamp given so far, head entries decreasing ones below.
Both rules, and the names of the orders (``FreeOrder``), live here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, Protocol

from blockpool.core.block import KVCacheBlock
from blockpool.core.free_queue import FreeKVCacheBlockQueue

# The free orders' names, everywhere (settings, the command line, the runtime).
FreeOrder = Literal["append_all", "uncached_first"]
APPEND_ALL: Final = "append_all"
UNCACHED_FIRST: Final = "uncached_first"
FREE_ORDERS: Final[tuple[FreeOrder, ...]] = (APPEND_ALL, UNCACHED_FIRST)


def check_free_order(name: object) -> FreeOrder:
    """``name`` if it is a known free order; ValueError otherwise."""
    if name not in FREE_ORDERS:
        raise ValueError(f"unknown free order {name!r} (known: {', '.join(FREE_ORDERS)})")
    return name


def goes_to_head(block: KVCacheBlock, free_order: str, enable_caching: bool) -> bool:
    """Whether a block whose ref count just reached 0 enters at the head."""
    return free_order == UNCACHED_FIRST and (block._block_hash is None or not enable_caching)


def free_uncached_first(
    queue: FreeKVCacheBlockQueue, caching: bool, ordered_blocks: Iterable[KVCacheBlock]
) -> None:
    """``BlockPool.free_blocks`` under ``"uncached_first"``: drop one reference
    on each block; hashless ones reaching 0 go to the head (given order),
    hashed ones to the tail (given order).  The null block is never queued."""
    first: list[KVCacheBlock] = []
    last: list[KVCacheBlock] = []
    for block in ordered_blocks:
        rc = block.ref_cnt - 1
        block.ref_cnt = rc
        if rc == 0 and not block.is_null:
            if block._block_hash is None or not caching:
                first.append(block)
            else:
                last.append(block)
    queue.prepend_n(first)
    queue.append_n(last)


class StampColumn(Protocol):
    """Where stamps are written: block id -> stamp (a list, a numpy array)."""

    def __setitem__(self, key: int, value: int, /) -> None: ...


class QueueStamps:
    """The stamp counters of one pool's free queue.

    ``low`` is the smallest stamp given so far, ``high`` the next tail stamp.
    """

    __slots__ = ("enable_caching", "free_order", "high", "low")

    def __init__(self, free_order: str, enable_caching: bool, low: int, high: int) -> None:
        self.free_order = check_free_order(free_order)
        self.enable_caching = enable_caching
        self.low = low
        self.high = high

    def stamp_queue(self, queue: Iterable[KVCacheBlock], col: StampColumn) -> int:
        """Stamp a whole queue, head first, above every stamp given so far
        (start-up, reset).  Returns how many blocks were stamped."""
        stamp = self.high
        for block in queue:
            col[block.block_id] = stamp
            stamp += 1
        n = stamp - self.high
        self.high = stamp
        return n

    def stamp_freed(self, ordered: Iterable[KVCacheBlock], col: StampColumn) -> int:
        """After ``pool.free_blocks(ordered)``: stamp the blocks that reached
        ref count 0 where the free order put them.  Returns how many went to
        the tail (they hold the stamps from the old ``high`` on)."""
        if self.free_order == APPEND_ALL:
            stamp = self.high
            for block in ordered:
                if block.ref_cnt == 0 and not block.is_null:
                    col[block.block_id] = stamp
                    stamp += 1
            n = stamp - self.high
            self.high = stamp
            return n
        caching = self.enable_caching
        head: list[int] = []
        tail = 0
        for block in ordered:
            if block.ref_cnt == 0 and not block.is_null:
                if block._block_hash is None or not caching:
                    head.append(block.block_id)
                else:
                    col[block.block_id] = self.high + tail
                    tail += 1
        self.high += tail
        low = self.low - len(head)
        for i, bid in enumerate(head):
            col[bid] = low + i
        self.low = low
        return tail
