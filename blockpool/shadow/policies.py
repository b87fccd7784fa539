"""Free-order policies for shadow pools: which free block is reused next.

A shadow pool (``blockpool.shadow.pool.ShadowPool``) keeps block slots
``1..capacity`` with ref counts and hashes, like BlockPool.  Its policy owns
the *free* slots (ref count 0) and decides the order in which they are reused
(and their cached hashes evicted).  Slot ids are ints; the policy reads
``keys[slot]`` (the slot's hash key or None) from the list the pool shares
with it.

Policies:

Their names are the free orders' (``blockpool.core.free_order``) plus ``"s3fifo"``;
``"vllm016"`` is an old spelling of ``"append_all"``, still accepted as input.

* ``AppendAll`` -- vLLM 0.16.0 (ours): every block reaching ref count 0 is
  appended to the tail in the order given; reuse pops the head.  Uncached
  (hashless) blocks sit between cached ones and push them out as they age.
* ``UncachedFirst`` -- later vLLM's ``free_blocks``: the blocks reaching 0 are
  split; those without a hash go to the FRONT of the queue (``prepend_n``,
  keeping their given order: the first listed becomes the new head), those
  with a hash to the tail (``append_n``).  Hashless blocks can never be a
  prefix hit, so spending them first keeps cached blocks longer.  (vLLM
  only splits when caching is on; shadows always cache.)
* ``S3FIFO`` -- S3-FIFO (Yang et al., SOSP '23) adapted to ref-counted blocks:
  free hashless blocks are used first (free space); cached free blocks live
  in a small FIFO S (first-time blocks) or a main FIFO M (blocks hit again,
  or whose hash is in the ghost FIFO G of hashes recently evicted from S).
  Reuse takes from S while S holds >= 10% of the capacity, else from M.  An
  S head that was hit since it entered moves to M instead of going; an M head
  with a positive frequency is re-queued with frequency - 1.  A one-time scan
  passes through S and leaves M (the reused working set) alone.  Adaptation:
  a block in use is outside every queue (it cannot be reused); when freed
  again it returns to the tail of its queue.

Complexity: ``release`` O(k), ``take`` O(1), ``victims`` O(n) (S3FIFO
amortised), ``order`` O(free).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Final

from blockpool.core.free_order import APPEND_ALL, UNCACHED_FIRST

S3FIFO_NAME: Final = "s3fifo"
POLICY_NAMES: Final[tuple[str, ...]] = (APPEND_ALL, UNCACHED_FIRST, S3FIFO_NAME)
# Old spellings accepted as input (settings, recordings): name -> its name now.
OLD_POLICY_NAMES: Final = {"vllm016": APPEND_ALL}


def policy_name(name: str) -> str:
    """The policy's name in ``POLICY_NAMES`` (an old spelling is mapped);
    ValueError naming the known ones otherwise."""
    name = OLD_POLICY_NAMES.get(name, name)
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown shadow policy {name!r} (one of {', '.join(POLICY_NAMES)})")
    return name


class _Lists:
    """Several intrusive doubly linked lists over slots ``1..capacity``.

    List ``k`` has sentinels ``capacity + 1 + 2k`` (head) and
    ``capacity + 2 + 2k`` (tail).  ``nxt``/``prv`` are plain int lists.
    """

    def __init__(self, capacity: int, count: int) -> None:
        self.capacity = capacity
        size = capacity + 1 + 2 * count
        self.nxt = [0] * size
        self.prv = [0] * size
        self.sizes = [0] * count
        for k in range(count):
            head, tail = self.head(k), self.tail(k)
            self.nxt[head] = tail
            self.prv[tail] = head

    def head(self, k: int) -> int:
        return self.capacity + 1 + 2 * k

    def tail(self, k: int) -> int:
        return self.capacity + 2 + 2 * k

    def append(self, k: int, slot: int) -> None:
        tail = self.capacity + 2 + 2 * k
        prv, nxt = self.prv, self.nxt
        last = prv[tail]
        nxt[last] = slot
        prv[slot] = last
        nxt[slot] = tail
        prv[tail] = slot
        self.sizes[k] += 1

    def extend(self, k: int, slots: Iterable[int]) -> None:
        tail = self.capacity + 2 + 2 * k
        prv, nxt = self.prv, self.nxt
        last = prv[tail]
        n = 0
        for slot in slots:
            nxt[last] = slot
            prv[slot] = last
            last = slot
            n += 1
        nxt[last] = tail
        prv[tail] = last
        self.sizes[k] += n

    def prepend(self, k: int, slots: Sequence[int]) -> None:
        """Put ``slots`` at the front, in the given order (first = new head)."""
        if not slots:
            return
        head = self.capacity + 1 + 2 * k
        prv, nxt = self.prv, self.nxt
        first = nxt[head]
        last = head
        for slot in slots:
            nxt[last] = slot
            prv[slot] = last
            last = slot
        nxt[last] = first
        prv[first] = last
        self.sizes[k] += len(slots)

    def remove(self, k: int, slot: int) -> None:
        prv, nxt = self.prv, self.nxt
        p, n = prv[slot], nxt[slot]
        nxt[p] = n
        prv[n] = p
        self.sizes[k] -= 1

    def first(self, k: int) -> int:
        """The head slot, or 0 when the list is empty."""
        slot = self.nxt[self.capacity + 1 + 2 * k]
        return 0 if slot == self.capacity + 2 + 2 * k else slot

    def pop_n(self, k: int, n: int) -> list[int]:
        head = self.capacity + 1 + 2 * k
        nxt = self.nxt
        out = []
        cur = nxt[head]
        for _ in range(n):
            out.append(cur)
            cur = nxt[cur]
        nxt[head] = cur
        self.prv[cur] = head
        self.sizes[k] -= n
        return out

    def items(self, k: int) -> list[int]:
        out = []
        tail = self.capacity + 2 + 2 * k
        cur = self.nxt[self.capacity + 1 + 2 * k]
        while cur != tail:
            out.append(cur)
            cur = self.nxt[cur]
        return out

    def check(self, k: int) -> list[int]:
        """Walk list ``k`` both ways; returns its items (AssertionError if broken)."""
        fwd = self.items(k)
        back = []
        head = self.capacity + 1 + 2 * k
        cur = self.prv[self.capacity + 2 + 2 * k]
        while cur != head:
            back.append(cur)
            cur = self.prv[cur]
            assert len(back) <= self.capacity, "list loops"
        assert fwd == back[::-1], f"list {k}: links disagree"
        assert len(fwd) == self.sizes[k] == len(set(fwd)), f"list {k}: size"
        assert all(1 <= s <= self.capacity for s in fwd), f"list {k}: bad slot"
        return fwd


class FreePolicy:
    """The free slots of one shadow pool and their reuse order."""

    name = "base"

    def __init__(self) -> None:
        self.capacity = 0
        self.keys: list[bytes | None] = []

    def bind(self, capacity: int, keys: list[bytes | None]) -> None:
        """Start with slots ``1..capacity`` free, in id order."""
        self.capacity = capacity
        self.keys = keys

    @property
    def num_free(self) -> int:
        raise NotImplementedError

    def release(self, slots: Sequence[int]) -> None:
        """Slots whose ref count reached 0, in the caller's eviction priority
        (first listed = to be reused first among them)."""
        raise NotImplementedError

    def take(self, slot: int) -> None:
        """A free slot is reused by a prefix hit: it leaves the free set."""
        raise NotImplementedError

    def hit(self, slot: int) -> None:
        """A cached slot was a prefix hit (free or held)."""

    def victims(self, n: int) -> list[int]:
        """Remove and return ``n`` free slots to reuse (``n <= num_free``);
        the caller drops their hashes."""
        raise NotImplementedError

    def cleared(self) -> None:
        """Every hash was dropped (prefix-cache reset)."""

    def order(self) -> list[int]:
        """Free slots, next to be reused first."""
        raise NotImplementedError

    def check(self) -> None:
        """Internal consistency (tests)."""


class AppendAll(FreePolicy):
    """vLLM 0.16.0: append every freed block to the tail; reuse the head."""

    name = APPEND_ALL

    def bind(self, capacity: int, keys: list[bytes | None]) -> None:
        super().bind(capacity, keys)
        self.lists = _Lists(capacity, 1)
        self.lists.extend(0, range(1, capacity + 1))

    @property
    def num_free(self) -> int:
        return self.lists.sizes[0]

    def release(self, slots: Sequence[int]) -> None:
        self.lists.extend(0, slots)

    def take(self, slot: int) -> None:
        self.lists.remove(0, slot)

    def victims(self, n: int) -> list[int]:
        return self.lists.pop_n(0, n) if n else []

    def order(self) -> list[int]:
        return self.lists.items(0)

    def check(self) -> None:
        self.lists.check(0)


class UncachedFirst(AppendAll):
    """Later vLLM: hashless blocks to the front (given order), cached ones to the tail."""

    name = UNCACHED_FIRST

    def release(self, slots: Sequence[int]) -> None:
        keys = self.keys
        uncached = [s for s in slots if keys[s] is None]
        if uncached:
            self.lists.prepend(0, uncached)
            self.lists.extend(0, [s for s in slots if keys[s] is not None])
        else:
            self.lists.extend(0, slots)


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
        self.lists = _Lists(capacity, 3)
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


def make_policy(name: str) -> FreePolicy:
    """A fresh policy by name (``POLICY_NAMES``, or an old spelling)."""
    return _POLICIES[policy_name(name)]()


_POLICIES: dict[str, type[FreePolicy]] = {
    APPEND_ALL: AppendAll,
    UNCACHED_FIRST: UncachedFirst,
    S3FIFO_NAME: S3FIFO,
}
