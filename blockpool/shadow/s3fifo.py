"""S3-FIFO (Yang et al., SOSP '23) adapted to ref-counted blocks:
free hashless blocks are used first (free space); cached free blocks live
in a small FIFO S (first-time blocks) or a main FIFO M (blocks hit again,
or whose hash is in the ghost FIFO G of hashes recently evicted from S).
Reuse takes from S while S holds >= 10% of the capacity, else from M.  An
S head that was hit since it entered moves to M instead of going; an M head
with a positive frequency is re-queued with frequency - 1.  A one-time scan
passes through S and leaves M (the reused working set) alone.  Adaptation:
a block in use is outside every queue (it cannot be reused); when freed
again it returns to the tail of its queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from blockpool.shadow.free_policy import FreePolicy
from blockpool.shadow.slot_lists import SlotLists

S3FIFO_NAME: Final = "s3fifo"

_NONE, _EMPTY, _SMALL, _MAIN = -1, 0, 1, 2


class S3FIFO(FreePolicy):
    """S3-FIFO over the free blocks (see the module docstring)."""

    name = S3FIFO_NAME

    def __init__(self, small_ratio: float = 0.1, promote_after: int = 1) -> None:
        super().__init__()
        if not 0 < small_ratio < 1:
            raise ValueError("small_ratio must be in (0, 1)")
        self.small_ratio = small_ratio
        self.promote_after = promote_after

    def bind(self, capacity: int, keys: list[bytes | None]) -> None:
        super().bind(capacity, keys)
        self.lists = SlotLists(capacity, 3)
        self.lists.extend(_EMPTY, range(1, capacity + 1))
        self.where = [_EMPTY] * (capacity + 1)
        self.where[0] = _NONE
        self.home = [_SMALL] * (capacity + 1)
        self.freq = [0] * (capacity + 1)
        # an OrderedDict: dropping the oldest is O(1) (``del d[next(iter(d))]`` on a
        # dict rescans the deleted slots at its front: quadratic over a long run)
        self.ghost: OrderedDict[bytes, None] = OrderedDict()
        self.ghost_limit = capacity
        self.small_target = max(1, int(capacity * self.small_ratio))
        self.promoted = 0
        self.ghost_hits = 0

    @property
    def num_free(self) -> int:
        s = self.lists.sizes
        return s[0] + s[1] + s[2]

    def release(self, slots: Sequence[int]) -> None:
        keys, where, home, ghost, lists = self.keys, self.where, self.home, self.ghost, self.lists
        for slot in slots:
            key = keys[slot]
            if key is None:
                lists.append(_EMPTY, slot)
                where[slot] = _EMPTY
                continue
            q = home[slot]
            if q == _SMALL and key in ghost:
                del ghost[key]
                q = home[slot] = _MAIN
                self.ghost_hits += 1
            lists.append(q, slot)
            where[slot] = q

    def take(self, slot: int) -> None:
        self.lists.remove(self.where[slot], slot)
        self.where[slot] = _NONE

    def hit(self, slot: int) -> None:
        f = self.freq[slot]
        if f < 3:
            self.freq[slot] = f + 1

    def _drop(self, slot: int) -> None:
        self.where[slot] = _NONE
        self.freq[slot] = 0
        self.home[slot] = _SMALL

    def _evict_small(self) -> int:
        lists, freq, keys = self.lists, self.freq, self.keys
        while True:
            slot = lists.first(_SMALL)
            if not slot:
                return 0
            lists.remove(_SMALL, slot)
            if freq[slot] >= self.promote_after:
                freq[slot] = 0
                self.home[slot] = _MAIN
                self.where[slot] = _MAIN
                lists.append(_MAIN, slot)
                self.promoted += 1
                continue
            key = keys[slot]
            if key is not None:
                ghost = self.ghost
                ghost[key] = None
                if len(ghost) > self.ghost_limit:
                    ghost.popitem(last=False)
            self._drop(slot)
            return slot

    def _evict_main(self) -> int:
        lists, freq = self.lists, self.freq
        while True:
            slot = lists.first(_MAIN)
            if not slot:
                return 0
            lists.remove(_MAIN, slot)
            f = freq[slot]
            if f > 0:
                freq[slot] = f - 1
                lists.append(_MAIN, slot)
                continue
            self._drop(slot)
            return slot

    def victims(self, n: int) -> list[int]:
        lists = self.lists
        k = min(n, lists.sizes[_EMPTY])
        out = lists.pop_n(_EMPTY, k) if k else []
        for slot in out:
            self._drop(slot)
        sizes = lists.sizes
        while len(out) < n:
            slot = 0
            if sizes[_SMALL] and (sizes[_SMALL] >= self.small_target or not sizes[_MAIN]):
                slot = self._evict_small()
            if not slot:
                slot = self._evict_main() or self._evict_small()
            if not slot:
                raise ValueError(f"cannot reuse {n} free slots: only {self.num_free} more")
            out.append(slot)
        return out

    def cleared(self) -> None:
        lists = self.lists
        moved = lists.items(_SMALL) + lists.items(_MAIN)
        for q in (_SMALL, _MAIN):
            for slot in lists.items(q):
                lists.remove(q, slot)
        lists.extend(_EMPTY, moved)
        for slot in moved:
            self.where[slot] = _EMPTY
        self.home = [_SMALL] * (self.capacity + 1)
        self.freq = [0] * (self.capacity + 1)
        self.ghost.clear()

    def order(self) -> list[int]:
        """Empty slots, then S, then M (the order ``victims`` would favour
        with S over its target; frequencies may reorder S and M)."""
        return self.lists.items(_EMPTY) + self.lists.items(_SMALL) + self.lists.items(_MAIN)

    def check(self) -> None:
        for q in (_EMPTY, _SMALL, _MAIN):
            for slot in self.lists.check(q):
                assert self.where[slot] == q, f"slot {slot} filed under {self.where[slot]}"
                if q == _EMPTY:
                    assert self.keys[slot] is None, f"empty slot {slot} has a hash"
                else:
                    assert self.keys[slot] is not None, f"cached slot {slot} has no hash"
        assert len(self.ghost) <= self.ghost_limit
