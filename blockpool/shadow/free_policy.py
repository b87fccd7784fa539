"""What a shadow pool's free-order policy does: it owns the free slots
(ref count 0) and orders their reuse (policies.py names them)."""

from __future__ import annotations

from collections.abc import Sequence


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
