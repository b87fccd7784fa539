"""BlockHashToBlockMap: prefix-cache index from hash key to block(s).

Most keys hold one block, stored directly; a second block under the same key
promotes the entry to a ``{block_id: block}`` dict.  No de-duplication: two
physical blocks with the same content both stay cached, because block ids
already handed to a request never change.

Complexity: every operation O(1) (pop from a promoted entry O(1) too).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from blockpool.core.block import KVCacheBlock
from blockpool.core.hashing import BlockHashWithGroupId

# A KVCacheBlock, or a {block_id: block} dict once a key holds several.
# Typed Any: hot paths test ``entry.__class__ is dict``, which mypy cannot narrow.
CacheEntry = Any


class BlockHashToBlockMap:
    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[bytes, CacheEntry] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        """The block under ``key`` (the first inserted if several), or None."""
        entry = self._cache.get(key)
        if entry is None:
            return None
        if entry.__class__ is dict:
            first: KVCacheBlock = next(iter(entry.values()))
            return first
        one: KVCacheBlock = entry
        return one

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        """Add ``block`` under ``key``; a second block promotes to a dict."""
        cache = self._cache
        entry = cache.get(key)
        if entry is None:
            cache[key] = block
        elif entry.__class__ is dict:
            entry[block.block_id] = block
        else:
            cache[key] = {entry.block_id: entry, block.block_id: block}

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Remove and return block ``block_id`` under ``key``.  A different
        single block stays and None is returned; a dict entry stays a dict
        even with one block left (and goes when it empties)."""
        cache = self._cache
        entry = cache.pop(key, None)
        if entry is None:
            return None
        if entry.__class__ is dict:
            block: KVCacheBlock | None = entry.pop(block_id, None)
            if entry:
                cache[key] = entry  # re-inserted, as vLLM does
            return block
        if entry.block_id == block_id:
            one: KVCacheBlock = entry
            return one
        cache[key] = entry
        return None

    def __len__(self) -> int:
        return len(self._cache)

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def blocks_under(self, key: BlockHashWithGroupId) -> list[KVCacheBlock]:
        """Every block under ``key``, in insertion order ([] if absent)."""
        entry = self._cache.get(key)
        if entry is None:
            return []
        if isinstance(entry, dict):
            return list(entry.values())
        return [entry]

    def iter_entries(self) -> Iterator[tuple[bytes, list[KVCacheBlock]]]:
        """(key, blocks) for every key, in insertion order of the keys."""
        for key, entry in self._cache.items():
            yield key, list(entry.values()) if isinstance(entry, dict) else [entry]
