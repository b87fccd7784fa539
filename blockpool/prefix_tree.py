"""The prefix tree that BlockStored events describe: hash -> parent, copies.

The builder of the runtime and replay: each
BlockStored names a chain of hashes and the parent of its first; each copy
of a hash counts, and a hash leaves the tree when its last copy is removed.
AllBlocksCleared empties it.
"""

from __future__ import annotations

from collections.abc import Iterable

from blockpool.events import AllBlocksCleared, BlockRemoved, BlockStored

Key = int | bytes  # a hash as events carry it (vLLM: ExternalBlockHash)


class PrefixTree:
    __slots__ = ("copies", "orphans", "parents")

    def __init__(self) -> None:
        self.parents: dict[Key, Key | None] = {}
        self.copies: dict[Key, int] = {}
        # hashes put in without knowing their parent (``restored``): roots
        # here, maybe not in the engine's tree; empty when the tree is whole
        self.orphans: set[Key] = set()

    def stored(self, hashes: Iterable[Key], parent: Key | None) -> None:
        parents, copies, orphans = self.parents, self.copies, self.orphans
        for h in hashes:
            parents[h] = parent
            copies[h] = copies.get(h, 0) + 1
            if orphans:
                orphans.discard(h)
            parent = h

    def removed(self, hashes: Iterable[Key]) -> None:
        parents, copies = self.parents, self.copies
        for h in hashes:
            n = copies.get(h, 0) - 1
            if n > 0:
                copies[h] = n
            else:
                copies.pop(h, None)
                parents.pop(h, None)
                self.orphans.discard(h)

    def restored(self, key: Key, parent: Key | None, known: bool) -> None:
        """One more copy of ``key`` (a resync), its parent known or not."""
        self.parents[key] = parent
        self.copies[key] = self.copies.get(key, 0) + 1
        if known:
            self.orphans.discard(key)
        else:
            self.orphans.add(key)

    def clear(self) -> None:
        self.parents.clear()
        self.copies.clear()
        self.orphans.clear()

    def apply(self, ev: object) -> None:
        """Follow one KV event (other objects are ignored)."""
        if isinstance(ev, BlockStored):
            self.stored(ev.block_hashes, ev.parent_block_hash)
        elif isinstance(ev, BlockRemoved):
            self.removed(ev.block_hashes)
        elif isinstance(ev, AllBlocksCleared):
            self.clear()

    def __len__(self) -> int:
        return len(self.copies)
