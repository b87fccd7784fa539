"""FreeKVCacheBlockQueue: the free blocks in eviction order.

An intrusive doubly linked list through the blocks' own ``prev_free_block`` /
``next_free_block`` fields, between two sentinel blocks (id -1), so that no
operation allocates an object or branches on emptiness.  Head = next to be
reused (and, if cached, evicted); blocks enter at the tail (vLLM 0.16.0), or
at the head with ``prepend_n`` (the ``"uncached_first"`` free order).

Complexity: popleft, remove, append O(1); popleft_n, append_n, prepend_n O(n);
get_all_free_blocks O(free).
"""

from __future__ import annotations

from collections.abc import Iterator

from blockpool.core.block import KVCacheBlock
from blockpool.core.errors import PoolAssertionError


def _chain(prev: KVCacheBlock, blocks: list[KVCacheBlock], end: KVCacheBlock) -> None:
    """Link ``prev``, then ``blocks`` in order, then ``end``, both ways."""
    for block in blocks:
        prev.next_free_block = block
        block.prev_free_block = prev
        prev = block
    prev.next_free_block = end
    end.prev_free_block = prev


class FreeKVCacheBlockQueue:
    __slots__ = ("fake_free_list_head", "fake_free_list_tail", "num_free_blocks")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        head = KVCacheBlock(block_id=-1)
        tail = KVCacheBlock(block_id=-1)
        self.fake_free_list_head = head
        self.fake_free_list_tail = tail
        self.num_free_blocks = len(blocks)
        _chain(head, blocks, tail)

    def popleft(self) -> KVCacheBlock:
        """Remove and return the head.  ValueError when the queue is empty."""
        head = self.fake_free_list_head
        first = head.next_free_block
        if first is None or first is self.fake_free_list_tail:
            # vLLM asserts the count agrees with an empty list.
            assert self.num_free_blocks == 0, (
                f"num_free_blocks ({self.num_free_blocks}) is out of sync with the free list."
            )
            raise ValueError("No free blocks available")
        nxt = first.next_free_block
        if nxt is None:
            raise RuntimeError(
                "Invalid block found in popleft() which doesn't have a valid next_free_block"
            )
        head.next_free_block = nxt
        nxt.prev_free_block = head
        first.prev_free_block = first.next_free_block = None
        self.num_free_blocks -= 1
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the first ``n`` blocks, head first."""
        if n == 0:
            return []
        if n < 0 or n > self.num_free_blocks:
            raise PoolAssertionError(
                f"cannot pop {n} blocks from a queue of {self.num_free_blocks}"
            )
        self.num_free_blocks -= n
        head = self.fake_free_list_head
        curr = head.next_free_block
        ret: list[KVCacheBlock] = []
        append = ret.append
        for _ in range(n):
            assert curr is not None
            append(curr)
            nxt = curr.next_free_block
            curr.prev_free_block = curr.next_free_block = None
            curr = nxt
        head.next_free_block = curr
        assert curr is not None
        curr.prev_free_block = head
        return ret

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from anywhere in the queue.  RuntimeError if it is
        not linked."""
        prev = block.prev_free_block
        nxt = block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Add ``block`` at the tail."""
        tail = self.fake_free_list_tail
        last = tail.prev_free_block
        if last is None:
            raise RuntimeError("prev_free_block of fake_free_list_tail should always exist")
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = tail
        tail.prev_free_block = block
        self.num_free_blocks += 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Add ``blocks`` at the head, in the given order (the first listed
        becomes the new head).  Used by the ``"uncached_first"`` free order."""
        head = self.fake_free_list_head
        first = head.next_free_block
        assert first is not None, "next_free_block of fake_free_list_head should always exist"
        self._insert_n(head, blocks, first)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """Add ``blocks`` at the tail, in the given order."""
        tail = self.fake_free_list_tail
        last = tail.prev_free_block
        assert last is not None, "prev_free_block of fake_free_list_tail should always exist"
        self._insert_n(last, blocks, tail)

    def _insert_n(self, prev: KVCacheBlock, blocks: list[KVCacheBlock], end: KVCacheBlock) -> None:
        """Link ``blocks`` in order between the neighbours ``prev`` and ``end``."""
        if blocks:
            _chain(prev, blocks, end)
            self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """The free blocks from head (next to go) to tail."""
        curr = self.fake_free_list_head.next_free_block
        while curr is not None and curr.next_free_block is not None:
            yield curr
            curr = curr.next_free_block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head to tail."""
        if self.fake_free_list_head.next_free_block is None:
            raise RuntimeError("next_free_block of fake_free_list_head should always exist")
        return list(self)
