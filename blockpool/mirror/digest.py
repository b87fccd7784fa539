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
* its place in the hash map under its key, as a link: the id of the block
  before it under the same key (duplicates keep their order), -1 for the
  only or first block of the key, -2 when it is not in the map.  A link,
  not an index: a block leaving a key changes the block after it only
  (blockpool/mirror/digest_sweep.py depends on that).

A sum of per-block values can be updated block by block: ``PoolDigest``
keeps each block's value and its links and key as last seen, and after any
pool calls ``update(ids)`` re-reads the blocks those calls named, their
neighbours in the queue before and after, and under a key they left (or
left and came back to) the block that followed them there -- the one whose
row links to them: a block joins a key at its end -- the only blocks whose
values a pool call can change.  (Not every block under the key: a prefix
many requests computed at once is cached as many blocks under one hash, and
re-reading them all for each was most of a reading's time on vLLM's
GPU-scale bench, ``make bench-gpu``.)  So following an engine costs
O(blocks its step touched), never O(pool); ``pool_digest`` computes the
same value from scratch (O(pool)).

Reads both blockpool's pool and vLLM's (0.16 and later): ``blocks`` with
``ref_cnt``, ``block_hash``, ``prev_free_block``/``next_free_block`` (the
queue's sentinels have block id -1), the map's ``_cache``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping
from itertools import compress
from typing import NamedTuple

from blockpool.core.hash_map import CacheEntry
from blockpool.mirror.pool_shape import PoolBlock, ReadPool

MASK = (1 << 64) - 1
NOT_QUEUED = -2
# The scheme: CPython's hash of a tuple of ints, the same in every 64-bit
# CPython since 3.8 (ints are not salted, unlike str and bytes); both sides
# say theirs in the handshake (``SCHEME``) and compare digests only when equal.
SCHEME = f"tuplehash-v2:{hash((1, -2, 3, 1 << 70, -(1 << 65))) & MASK:x}"
NOT_MAPPED = -2  # a block's map link when it is not in the map
FIRST = -1  # ... when it is the first (or only) block of its key
_from_bytes = int.from_bytes
PAUSE_EVERY = 64  # blocks read between two calls of a reading's pause
# A block's row in ``PoolDigest.rows``, one array for all: a row's fields lie
# side by side (one cache line read, not one per column: reading is bound by
# memory, measured).  The value is kept as ``hash`` gives it (signed: the sum
# mod 2**64 is the same); the key's fingerprint (its ``hash``, salted per
# process: this process's own) tells a changed key without touching the
# key kept in ``PoolDigest.keys``.
ROW = 5
VALUE, PREV, NEXT, LINK, KEY_FP = range(ROW)  # (the hot loops below say 0..4)
NO_KEY = -1  # the fingerprint of no key (``hash`` never gives -1)
EMPTY_ROW = (0, NOT_QUEUED, NOT_QUEUED, NOT_MAPPED, NO_KEY)
STAGED = 1 + ROW  # a staged row: the block's id, then its row


class Interrupted(Exception):
    """A staged reading stopped by its pause.  ``staged``: what it read
    before (``stage``); ``left``: the blocks it had still to read -- named,
    or found through a changed link -- once ``staged`` is taken: read at a
    later moment, they leave the digest as exact as one reading of all
    (each is read as it is then, its row's old links finding what changed
    through it).  Neither may be taken if the pool moved meanwhile."""

    def __init__(self, staged: Staged | None = None, left: list[int] | None = None) -> None:
        super().__init__("the reading was stopped by its pause")
        self.staged = staged
        self.left = left if left is not None else []


class Staged(NamedTuple):
    """What ``PoolDigest.stage`` read: the blocks' rows (``STAGED`` ints a
    block, in one array: nothing for the garbage collector to walk), the keys
    of those whose key changed, and the new total."""

    rows: array[int]
    keys: dict[int, bytes | None]
    total: int


def _link(b: PoolBlock | None) -> int:
    return NOT_QUEUED if b is None else int(b.block_id)


def map_link(cache: Mapping[bytes, CacheEntry], key: bytes, block: PoolBlock) -> int:
    """The block before ``block`` in the hash map under ``key``: its id,
    ``FIRST`` when none is, ``NOT_MAPPED`` when ``block`` is not there."""
    v = cache.get(key)
    if v is None:
        return NOT_MAPPED
    if v.__class__ is dict:
        before = FIRST
        for bid in v:
            if bid == block.block_id:
                return before if v[bid] is block else NOT_MAPPED
            before = bid
        return NOT_MAPPED
    return FIRST if v is block else NOT_MAPPED


def block_value(bid: int, ref: int, prev: int, nxt: int, link: int, key: bytes | None) -> int:
    """One block's 64-bit share of the digest (``link``: its map link)."""
    kv = -1 if key is None else _from_bytes(key, "little")
    return hash((bid, ref, prev, nxt, link, kv)) & MASK


def _read(
    cache: Mapping[bytes, CacheEntry], b: PoolBlock
) -> tuple[int, int, int, int, bytes | None]:
    """(ref, prev, next, map link, key) of one block, as it is now."""
    k = b.block_hash
    key = None if k is None else bytes(k)
    link = NOT_MAPPED if k is None else map_link(cache, k, b)
    return b.ref_cnt, _link(b.prev_free_block), _link(b.next_free_block), link, key


def format_digest(total: int) -> str:
    return f"{total & MASK:016x}"


def pool_digest(pool: ReadPool) -> str:
    """The digest of a pool now, from scratch (O(pool))."""
    cache = pool.cached_block_hash_to_block._cache
    total = len(pool.blocks)
    for b in pool.blocks[1:]:
        ref, prev, nxt, link, key = _read(cache, b)
        total += block_value(b.block_id, ref, prev, nxt, link, key)
    return format_digest(total)


class PoolDigest:
    """The digest of one pool, updated block by block (see the module doc)."""

    def __init__(self, pool: ReadPool) -> None:
        self.pool = pool
        n = len(pool.blocks)
        self.n = n
        self.rows = array("q", EMPTY_ROW) * n  # block id * ROW: its row
        self.keys: list[bytes | None] = [None] * n  # the key each row was read with
        self.total = n
        self.refresh()

    @property
    def value(self) -> str:
        return format_digest(self.total)

    def refresh(self) -> None:
        """Every block re-read (after a reset, a restore: O(pool))."""
        n = self.n
        self.rows[:] = array("q", EMPTY_ROW) * n  # none counted yet
        self.keys[:] = [None] * n
        new, _ = self.read_into(range(1, n))
        self.total = (n + new) & MASK

    def after_reset(self) -> None:
        """A prefix-cache reset cleared every hash and moved no block: the
        blocks that held a hash are re-read (a C-speed scan finds them)."""
        new, old = self.read_into(list(compress(range(len(self.keys)), self.keys)))
        self.total = (self.total + new - old) & MASK

    def update(self, ids: Iterable[int]) -> None:
        """The blocks named by the pool calls since the last update changed
        (see ``stage``): the digest brought up to date -- read as ``stage``
        reads them, each row written as it is read (the one writer's own
        digest: nothing reads it meanwhile), then committed."""
        self.commit(self._read_changed(ids, None, direct=True))

    def commit(self, staged: Staged) -> None:
        """Take what ``stage`` read (nothing read it since: see ``stage``)."""
        rows, got = self.rows, staged.rows
        for j in range(0, len(got), STAGED):
            i = got[j] * ROW
            rows[i : i + ROW] = got[j + 1 : j + STAGED]
        keys = self.keys
        for bid, key in staged.keys.items():
            keys[bid] = key
        self.total = staged.total

    def stage(self, ids: Iterable[int], pause: Callable[[], bool] | None = None) -> Staged:
        """Read what the blocks named by the pool calls since the last update
        are now -- them, then the blocks whose links to them changed (their
        neighbours in the queue before and after, where a link differs, and
        the block that followed them under a key they left or moved in) --
        without changing this digest: ``commit`` takes the result.  So
        another thread can read while the pool may change under it, and
        throw the result away when it did (``blockpool_vllm``'s follower,
        off the engine's thread).  ``pause``, called every ``PAUSE_EVERY``
        blocks, may let the pool's owner run and says whether to go on (else
        ``Interrupted``, with what was read so far and the blocks left: a
        reader out of time whose pool stood still takes the one and reads
        the others at its next moment).

        A block found that way is read as a named one is: where its own
        links differ from its row, the blocks on both sides are read too
        (and so on).  So what a reading takes is closed -- no row it stores
        drops old links some other block's change is found by -- and the
        blocks named since the last update may be read in parts, each at a
        moment of its own (a later call's blocks are named again later):
        a part's reading then takes the neighbours' old links with it."""
        return self._read_changed(ids, pause, direct=False)

    def _read_changed(
        self, ids: Iterable[int], pause: Callable[[], bool] | None, *, direct: bool
    ) -> Staged:
        """``stage``'s reading; ``direct``: each row written into this
        digest as it is read (``update``: no pause, nothing staged but the
        keys and the total).  The same reading either way: a block is read
        once, so its own row is still its old one when it is read; a block
        read already whose row a later block's check sees is never read
        again, whichever row that check sees."""
        blocks = self.pool.blocks
        n = self.n
        cache = self.pool.cached_block_hash_to_block._cache
        rows, skeys = self.rows, self.keys
        total = self.total
        # the rows read, ``STAGED`` ints a block: a list while it grows (a
        # tuple added to a list is copied in C; to an array, item by item:
        # 0.5 us of a block's 1.9, measured), an array once read
        got: list[int] = []
        keys: dict[int, bytes | None] = {}
        done: set[int] = set()
        # the named, then the blocks found on the way (read the same way):
        # a list read while it grows
        work = list(ids)
        add_more = work.append
        named = len(work)  # work[:named]: the blocks the calls named
        left = PAUSE_EVERY + 1  # (the first pause once PAUSE_EVERY blocks are read)
        for at, bid in enumerate(work):
            if bid in done or not 0 < bid < n:
                continue
            if pause is not None:
                left -= 1
                if not left:
                    left = PAUSE_EVERY
                    if not pause():
                        rest = [y for y in work[at:] if y not in done and 0 < y < n]
                        staged = Staged(array("q", got), keys, total & MASK)
                        raise Interrupted(staged, list(dict.fromkeys(rest)))
            done.add(bid)
            b = blocks[bid]
            p, x = b.prev_free_block, b.next_free_block
            prev = NOT_QUEUED if p is None else p.block_id
            nxt = NOT_QUEUED if x is None else x.block_id
            i = bid * ROW
            old = rows[i + 1]
            if prev != old:  # both the old and the new neighbour changed links
                if old > 0:
                    add_more(old)
                if prev > 0:
                    add_more(prev)
            old = rows[i + 2]
            if nxt != old:
                if old > 0:
                    add_more(old)
                if nxt > 0:
                    add_more(nxt)
            k = b._block_hash  # (not the property: a Python call a block)
            if k is None:
                fp = NO_KEY
                link = NOT_MAPPED
                v = hash((bid, b.ref_cnt, prev, nxt, NOT_MAPPED, -1))
            else:
                fp = hash(k)
                e = cache.get(k)
                if e is b:
                    link = FIRST
                elif e.__class__ is dict:
                    link = map_link(cache, k, b)
                    if at < named:  # a call named it: if it left and came back -- even
                        for y in e:  # behind the same block -- the block that followed
                            if rows[y * ROW + 3] == bid:  # it follows another now: the
                                add_more(y)  # one whose row links to it
                else:
                    link = NOT_MAPPED
                v = hash((bid, b.ref_cnt, prev, nxt, link, _from_bytes(k, "little")))
            if fp != rows[i + 4]:  # a new key (kept), or a key it left:
                okey = skeys[bid]  # the block that followed it there has a new link
                if okey is not None:
                    e = cache.get(okey)
                    if e is not None:
                        if e.__class__ is dict:
                            for y in e:
                                if rows[y * ROW + 3] == bid:
                                    add_more(y)
                        else:
                            add_more(e.block_id)
                keys[bid] = None if k is None else bytes(k)
            total += v - rows[i]
            if direct:
                rows[i] = v
                rows[i + 1] = prev
                rows[i + 2] = nxt
                rows[i + 3] = link
                rows[i + 4] = fp
            else:
                got += (bid, v, prev, nxt, link, fp)
        return Staged(array("q", got), keys, total & MASK)

    def read_into(
        self, ids: Iterable[int], pause: Callable[[], bool] | None = None
    ) -> tuple[int, int]:
        """Read blocks straight into this digest's rows (the hot loop:
        block_value and _read, inlined), leaving the total to the caller:
        the sum of their new values and of the values they replace.  A
        reading stopped by ``pause`` (``Interrupted``) leaves the rows it
        read written -- for a caller whose rows those are not yet (a sweep's
        invalid rows, blockpool/mirror/digest_sweep.py)."""
        blocks = self.pool.blocks
        cache = self.pool.cached_block_hash_to_block._cache
        rows, skeys = self.rows, self.keys
        new = old = 0
        left = PAUSE_EVERY
        for bid in ids:
            if bid <= 0:
                continue
            if pause is not None:
                left -= 1
                if not left:
                    left = PAUSE_EVERY
                    if not pause():
                        raise Interrupted
            b = blocks[bid]
            p, x = b.prev_free_block, b.next_free_block
            prev = NOT_QUEUED if p is None else p.block_id
            nxt = NOT_QUEUED if x is None else x.block_id
            k = b._block_hash  # (not the property: a Python call a block)
            if k is None:
                fp = NO_KEY
                link = NOT_MAPPED
                v = hash((bid, b.ref_cnt, prev, nxt, NOT_MAPPED, -1))
            else:
                fp = hash(k)
                e = cache.get(k)
                if e is b:
                    link = FIRST
                elif e.__class__ is dict:
                    link = map_link(cache, k, b)
                else:
                    link = NOT_MAPPED
                v = hash((bid, b.ref_cnt, prev, nxt, link, _from_bytes(k, "little")))
            i = bid * ROW
            new += v
            old += rows[i]
            if fp != rows[i + 4]:
                skeys[bid] = None if k is None else bytes(k)
            rows[i] = v
            rows[i + 1] = prev
            rows[i + 2] = nxt
            rows[i + 3] = link
            rows[i + 4] = fp
        return new, old
