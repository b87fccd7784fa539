"""Intrusive doubly linked lists of slots, in plain int lists: the free
queues of the shadow policies."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class SlotLists:
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
