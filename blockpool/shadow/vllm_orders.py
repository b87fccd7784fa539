"""vLLM's free orders as shadow policies: ``AppendAll`` (vLLM 0.16.0) and
``UncachedFirst`` (later vLLM; policies.py describes both)."""

from __future__ import annotations

from collections.abc import Sequence

from blockpool.core.free_order import APPEND_ALL, UNCACHED_FIRST
from blockpool.shadow.free_policy import FreePolicy
from blockpool.shadow.slot_lists import SlotLists


class AppendAll(FreePolicy):
    """vLLM 0.16.0: append every freed block to the tail; reuse the head."""

    name = APPEND_ALL

    def bind(self, capacity: int, keys: list[bytes | None]) -> None:
        super().bind(capacity, keys)
        self.lists = SlotLists(capacity, 1)
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
