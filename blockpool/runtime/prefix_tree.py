"""The prefix tree that BlockStored events describe: hash -> parent, copies.

The builder of the runtime and replay: each
BlockStored names a chain of hashes and the parent of its first; each copy
of a hash counts, and a hash leaves the tree when its last copy is removed.
AllBlocksCleared empties it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from blockpool.core.events import AllBlocksCleared, BlockRemoved, BlockStored

Key = int | bytes  # a hash as events carry it (vLLM: ExternalBlockHash)


class EventPrefixTree:
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

    def children(self) -> dict[Key | None, list[Key]]:
        return children(self.parents)

    def depths(self) -> dict[Key, tuple[Key, int]]:
        return depths(self.parents)


# The walks over a tree given as hash -> parent: EventPrefixTree's own and the
# observer's (whose hash map keeps each hash's parent with its entry).
Parents = Mapping[Key, Key | None]


def children(parents: Parents) -> dict[Key | None, list[Key]]:
    """parent -> children; a hash whose parent is not in the tree (a first
    block, or one whose parent left first) is a root, under None."""
    out: dict[Key | None, list[Key]] = {}
    for h, p in parents.items():
        out.setdefault(p if p is not None and p in parents else None, []).append(h)
    return out


def depths(parents: Parents) -> dict[Key, tuple[Key, int]]:
    """hash -> (its root in the tree, depth from 1)."""
    memo: dict[Key, tuple[Key, int]] = {}
    for h in parents:
        if h in memo:
            continue
        path: list[Key] = []
        cur: Key | None = h
        while cur is not None and cur in parents and cur not in memo:
            path.append(cur)
            if len(path) > len(parents):  # a cycle: not from an engine
                break
            cur = parents[cur]
        if cur is not None and cur in memo:
            root, depth = memo[cur]
        else:
            root, depth = path[-1], 0
        for node in reversed(path):
            depth += 1
            memo[node] = (root, depth)
    return memo


def breadth_first(kids: dict[Key | None, list[Key]], limit: int) -> list[tuple[Key, int]]:
    """(hash, depth) of at most ``limit`` hashes: the roots, then each level."""
    out: list[tuple[Key, int]] = []
    level = [(h, 1) for h in kids.get(None, [])]
    while level and len(out) < limit:
        out.extend(level[: limit - len(out)])
        level = [(c, d + 1) for h, d in level for c in kids.get(h, ())]
    return out
