"""The pool's digest, kept up to date in O(what changed).

The digest proves a mirror's pool equal to the engine's: both compute it
over their own pool and a batch carries the engine's.  It is the sum
(mod 2**64) of one 64-bit value per block (the null block, id 0, left out),
each a hash of everything the pool's future behaviour depends on for that
block:

* its ref count and its hash key (the hash with its group id),
* its links in the free queue (the ids of the blocks before and after it,
  -1 for the queue's ends, -2 when it is not queued), which together give
  the queue's order,
* its place in the hash map under its key (-1: not in the map; 0 for the
  only or first block of the key, 1, 2, ... for later duplicates).

A sum of per-block values can be updated block by block: ``PoolDigest``
keeps each block's value and its links and key as last seen, and after any
pool calls ``update(ids)`` re-reads the blocks those calls named, their
neighbours in the queue before and after, and the other blocks under the
keys they held or hold -- the only blocks whose values a pool call can
change.  So following an engine costs O(blocks its step touched), never
O(pool); ``pool_digest`` computes the same value from scratch (O(pool)).

Reads both blockpool's pool and vLLM's (0.16 and later): ``blocks`` with
``ref_cnt``, ``block_hash``, ``prev_free_block``/``next_free_block`` (the
queue's sentinels have block id -1), the map's ``_cache``.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from hashlib import blake2b
from typing import Any

MASK = (1 << 64) - 1
NOT_QUEUED = -2
_PACK = struct.Struct("<iiiiib").pack


def _link(b: Any) -> int:
    return NOT_QUEUED if b is None else int(b.block_id)


def map_position(cache: dict[Any, Any], key: Any, block: Any) -> int:
    """Where ``block`` sits in the hash map under ``key`` (-1: not there)."""
    v = cache.get(key)
    if v is None:
        return -1
    if isinstance(v, dict):
        for i, bid in enumerate(v):
            if bid == block.block_id:
                return i if v[bid] is block else -1
        return -1
    return 0 if v is block else -1


def block_value(bid: int, ref: int, prev: int, nxt: int, pos: int, key: bytes | None) -> int:
    """One block's 64-bit share of the digest."""
    h = blake2b(
        _PACK(bid, ref, prev, nxt, pos, -1 if key is None else len(key) & 127), digest_size=8
    )
    if key is not None:
        h.update(key)
    return int.from_bytes(h.digest(), "little")


def _read(cache: dict[Any, Any], b: Any) -> tuple[int, int, int, int, bytes | None]:
    """(ref, prev, next, map position, key) of one block, as it is now."""
    k = b.block_hash
    key = None if k is None else bytes(k)
    pos = -1 if k is None else map_position(cache, k, b)
    return b.ref_cnt, _link(b.prev_free_block), _link(b.next_free_block), pos, key


def format_digest(total: int) -> str:
    return f"{total & MASK:016x}"


def pool_digest(pool: Any) -> str:
    """The digest of a pool now, from scratch (O(pool))."""
    cache = pool.cached_block_hash_to_block._cache
    total = len(pool.blocks)
    for b in pool.blocks[1:]:
        ref, prev, nxt, pos, key = _read(cache, b)
        total += block_value(b.block_id, ref, prev, nxt, pos, key)
    return format_digest(total)


class PoolDigest:
    """The digest of one pool, updated block by block (see the module doc)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        n = len(pool.blocks)
        self.values = array("Q", bytes(8 * n))
        self.prev = array("i", [NOT_QUEUED]) * n
        self.next = array("i", [NOT_QUEUED]) * n
        self.keys: list[bytes | None] = [None] * n
        # ref count and map position as last seen (-3: never read): a block
        # re-read unchanged keeps its value (no hash computed)
        self.refs = array("i", [-3]) * n
        self.pos = array("i", [-3]) * n
        self.total = n
        self.refresh()

    @property
    def value(self) -> str:
        return format_digest(self.total)

    def refresh(self) -> None:
        """Every block re-read (after a reset, a restore: O(pool))."""
        self.total = len(self.pool.blocks)
        self.values[0] = 0
        self._reread(range(1, len(self.pool.blocks)), full=True)

    def update(self, ids: Iterable[int]) -> None:
        """The blocks named by the pool calls since the last update changed:
        re-read them and every block those calls could have changed."""
        blocks = self.pool.blocks
        n = len(blocks)
        dirty: set[int] = set()
        seen: set[int] = set()
        add, mark = dirty.add, seen.add
        sprev, snext, skeys = self.prev, self.next, self.keys
        cache = self.pool.cached_block_hash_to_block._cache
        keys: set[bytes] = set()
        for bid in ids:
            if bid in seen or not 0 < bid < n:
                continue
            mark(bid)
            add(bid)
            b = blocks[bid]
            link = sprev[bid]
            if link > 0:
                add(link)
            link = snext[bid]
            if link > 0:
                add(link)
            p = b.prev_free_block
            if p is not None and p.block_id > 0:
                add(p.block_id)
            p = b.next_free_block
            if p is not None and p.block_id > 0:
                add(p.block_id)
            old = skeys[bid]
            if old is not None:
                keys.add(old)
            k = b.block_hash
            if k is not None:
                keys.add(bytes(k))
        for key in keys:  # the other blocks under those keys may have moved up
            v = cache.get(key)
            if isinstance(v, dict):
                dirty.update(v)
            elif v is not None:
                dirty.add(v.block_id)
        self._reread(dirty)

    def _reread(self, ids: Iterable[int], full: bool = False) -> None:
        """``_read`` and ``block_value`` of each block, inlined (the mirror
        re-reads hundreds of blocks per engine step); a block whose state is
        as last seen keeps its value."""
        blocks = self.pool.blocks
        cache = self.pool.cached_block_hash_to_block._cache
        values, sprev, snext, skeys = self.values, self.prev, self.next, self.keys
        srefs, spos = self.refs, self.pos
        pack, hasher, from_bytes = _PACK, blake2b, int.from_bytes
        total = self.total
        for bid in ids:
            if bid <= 0:
                continue
            b = blocks[bid]
            k = b.block_hash
            if k is None:
                key = None
                pos = -1
            else:
                key = bytes(k)
                v = cache.get(k)
                if v is b:
                    pos = 0
                elif isinstance(v, dict):
                    pos = map_position(cache, k, b)
                else:
                    pos = -1
            ref = b.ref_cnt
            p = b.prev_free_block
            prev = NOT_QUEUED if p is None else int(p.block_id)
            p = b.next_free_block
            nxt = NOT_QUEUED if p is None else int(p.block_id)
            if (
                not full
                and ref == srefs[bid]
                and prev == sprev[bid]
                and nxt == snext[bid]
                and pos == spos[bid]
                and key == skeys[bid]
            ):
                continue
            if key is None:
                h = hasher(pack(bid, ref, prev, nxt, pos, -1), digest_size=8)
            else:
                h = hasher(pack(bid, ref, prev, nxt, pos, len(key) & 127), digest_size=8)
                h.update(key)
            val = from_bytes(h.digest(), "little")
            if not full:
                total -= values[bid]
            total += val
            values[bid] = val
            sprev[bid] = prev
            snext[bid] = nxt
            skeys[bid] = key
            srefs[bid] = ref
            spos[bid] = pos
        self.total = total & MASK
