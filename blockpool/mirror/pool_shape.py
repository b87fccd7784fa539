"""What the mirror reads of a pool, as a type: blockpool's ``BlockPool`` and
vLLM's (0.16 and later) both have this shape (blockpool/mirror/digest.py
reads it, poolview.py copies it into a snapshot).  Read-only members
(properties), so that either pool's own classes fit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from blockpool.core.hash_map import CacheEntry


class PoolBlock(Protocol):
    """A block: its id, ref count, hash key and links in the free queue."""

    @property
    def block_id(self) -> int: ...

    @property
    def ref_cnt(self) -> int: ...

    @property
    def block_hash(self) -> bytes | None: ...

    @property
    def _block_hash(self) -> bytes | None:
        """The same, as the block keeps it: read straight in the digest's hot
        loops (every pool read -- vLLM 0.16 and later, blockpool's -- keeps it
        so, behind a ``block_hash`` property: a Python call a block)."""
        ...

    @property
    def prev_free_block(self) -> PoolBlock | None: ...

    @property
    def next_free_block(self) -> PoolBlock | None: ...


class FreeQueue(Protocol):
    """The free queue's sentinels (block id -1)."""

    @property
    def fake_free_list_head(self) -> PoolBlock: ...

    @property
    def fake_free_list_tail(self) -> PoolBlock: ...


class MapEntries(Protocol):
    """The hash map's entries: a block, or a dict of blocks by id."""

    @property
    def _cache(self) -> Mapping[bytes, CacheEntry]: ...


class ReadPool(Protocol):
    """A pool as the mirror reads it."""

    @property
    def blocks(self) -> Sequence[PoolBlock]: ...

    @property
    def free_block_queue(self) -> FreeQueue: ...

    @property
    def cached_block_hash_to_block(self) -> MapEntries: ...
