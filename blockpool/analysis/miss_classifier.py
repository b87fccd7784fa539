"""Why a prompt block missed: the reason classifier.

Every block of an admitted prompt that is not a prefix hit gets one reason
(the codes: ``reasons.py``):

``last_token``
    Its hash was cached and every earlier block hit, but it holds the last
    prompt token, which vLLM always computes (the lookup stops one block
    short).
``block_size_floor``
    The partial tail block (fewer than ``block_size`` tokens: never hashed),
    or the first missing block shares 1..block_size-1 leading tokens with
    what followed the same (hit) block in the last request that went
    through it -- its next block, or its partial tail (decode tokens count):
    the prompts diverge inside this block, so the shared tokens cannot hit.
    For the first block, the comparison is with the last first block stored
    under the same extra keys.  ``shared_tokens`` says how many.
``evicted``
    Its hash was stored before and evicted since; the detail says how long
    ago, why (reuse of the block, the evict operation, a reset), which
    block held it, who took that block, its queue position when it was
    freed, the allocations between its free and its eviction, and its
    seconds in the queue.
``reset``
    Its hash was stored before and dropped by a prefix-cache reset since
    (and not stored again): no eviction, no regret -- a bigger cache would
    not have kept it either.  The detail is the reset's (cause ``reset``).
``extra_keys``
    The prompt's first block was stored with the same tokens under other
    extra keys (cache salt, LoRA adapter): its hash differs, so nothing can
    hit.  Recognised on the first block (where the cache salt applies and
    every chain starts); later blocks follow the chain (``cold``).
``chain_broken``
    Its hash is still cached, but an earlier block missed and vLLM stops at
    the first miss.
``cold``
    Never seen (within the memory of the bounded indexes).

Chaining makes later blocks follow the first miss: after a ``cold``,
``block_size_floor`` or ``extra_keys`` first miss every later full block is
``cold`` (their hashes chain through one never seen), so the work per
admission is about one lookup, not one per block; after an ``evicted`` first
miss each later block is looked up (in C, over the slice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blockpool.analysis.common import Hist, h64
from blockpool.analysis.evictions import EvictionRing
from blockpool.analysis.floor import FloorIndex
from blockpool.common.keys import digest64
from blockpool.common.miss_reasons import (
    CHAIN_BROKEN,
    COLD,
    EVICTED,
    EXTRA_KEYS,
    FLOOR,
    LAST_TOKEN,
    RESET_DROP,
    Tag,
)

if TYPE_CHECKING:
    from blockpool import BlockPool

GID0 = b"\0\0\0\0"


@dataclass
class MissClassifier:
    """The reason of each block of an admitted prompt, read from the pool's
    hash map and the tracker's indexes (the eviction ring, the floor, the
    first blocks by extra keys), which the tracker keeps up to date;
    ``floor_shared`` observes the tokens a ``block_size_floor`` shares."""

    pool: BlockPool
    ring: EvictionRing
    floor: FloorIndex
    firsts: dict[tuple[int, ...], dict[Tag, str]]
    bs: int
    floor_shared: Hist

    def classify(
        self,
        tokens: list[int],
        ids0: list[int],
        tag: Tag,
        first: tuple[int, ...] | None,
        hashes: Any,
        table0: list[Any],
        num_hit: int,
        evicted_now: list[int],
    ) -> tuple[bytearray, dict[int, Any] | None, list[tuple[int, int]]]:
        """(the code of each prompt block, details by block index, the
        evicted misses as (block index, ring serial)); ``evicted_now``:
        hashes this admission's allocation evicted."""
        bs = self.bs
        fl = self.floor
        n = len(tokens)
        full = n // bs
        total = -(-n // bs)
        codes = bytearray(total)
        details: dict[int, Any] | None = None
        ev_set: set[int] | None = set(evicted_now) if evicted_now else None
        regrets: list[tuple[int, int]] = []  # (block index, ring serial)
        i = num_hit
        if i < full:
            max_hit = (n - 1) // bs
            h = hashes[i]
            info: Any = None
            if i == max_hit and self._pre_cached(h, table0[i], ev_set):
                code = LAST_TOKEN
            else:
                code, info = self._history(h)
                if code in (EVICTED, RESET_DROP):
                    if code == EVICTED:
                        regrets.append((i, info))
                elif i == 0 and first is not None and (found := self._other_keys(first, tag)):
                    code, info = EXTRA_KEYS, found
                elif code == COLD:
                    with_rid: str | None = None
                    cand: Sequence[int] = ()
                    if i == 0:
                        latest = fl.root_latest.get(tag)
                        if latest is not None:
                            cand, with_rid = latest
                    else:
                        cand, with_rid = fl.cont(ids0[i - 1])
                    shared = fl.shared(cand, tokens, i * bs)
                    if shared >= bs:
                        code, info = EVICTED, {"forgotten": True}
                    elif shared:
                        code = FLOOR
                        info = {"shared_tokens": shared, "with_request": with_rid}
                        self.floor_shared.observe(shared)
            if info is not None:
                details = {i: info}
            if code in (COLD, FLOOR, EXTRA_KEYS):
                codes[i] = code
                if full > i + 1:
                    codes[i + 1 : full] = bytes([COLD]) * (full - i - 1)
            else:
                codes[i] = code
                if full > i + 1:
                    details = self._chain(
                        hashes, i + 1, full, table0, ev_set, codes, details, regrets
                    )
        tail = n - full * bs
        if tail:
            codes[full] = FLOOR
            if details is None:
                details = {}
            details[full] = {"partial": True, "tokens": tail}
        return codes, details, regrets

    def _pre_cached(self, h: bytes, own: Any, evicted_now: set[int] | None) -> bool:
        """Whether ``h`` (group 0) was in the map before this operation: a
        block other than ``own`` holds it now, or this operation evicted it."""
        entry = self.pool.cached_block_hash_to_block._cache.get(h + GID0)
        if entry is not None:
            if entry.__class__ is dict:
                if any(b is not own for b in entry.values()):
                    return True
            elif entry is not own:
                return True
        return evicted_now is not None and h64(h) in evicted_now

    def _chain(
        self,
        hashes: Any,
        start: int,
        full: int,
        table0: list[Any],
        ev_set: set[int] | None,
        codes: bytearray,
        details: dict[int, Any] | None,
        regrets: list[tuple[int, int]],
    ) -> dict[int, Any] | None:
        """Blocks after a first miss that was not cold: each is cached
        (chain_broken), evicted or cold (and then so is the rest).
        The lookups run in C (comprehensions over the slice)."""
        hs = hashes[start:full]
        cache = self.pool.cached_block_hash_to_block._cache
        ents = [cache.get(h + GID0) for h in hs]
        hv = list(map(digest64, hs))
        ring = self.ring
        serials = list(map(ring.evicted.get, hv))
        floor = ring.ev_serial - ring.size
        for k, e in enumerate(ents):
            j = start + k
            if e.__class__ is dict:
                own = table0[j]
                if any(b is not own for b in e.values()):
                    codes[j] = CHAIN_BROKEN
                    continue
            if ev_set is not None and hv[k] in ev_set:
                codes[j] = CHAIN_BROKEN
                continue
            s = serials[k]
            if s is not None and s >= floor:
                if ring.by_reset(s):
                    codes[j] = RESET_DROP
                else:
                    codes[j] = EVICTED
                    regrets.append((j, s))
                if details is None:
                    details = {}
                details[j] = s
                continue
            codes[j:full] = bytes([COLD]) * (full - j)
            break
        return details

    def _history(self, h: bytes) -> tuple[int, Any]:
        """A full block whose hash is not cached: evicted or dropped by a
        reset (with its ring serial), or cold."""
        serial = self.ring.eviction(h64(h))
        if serial >= 0:
            return (RESET_DROP if self.ring.by_reset(serial) else EVICTED), serial
        return COLD, None

    def _other_keys(self, first: tuple[int, ...], tag: Tag) -> dict[str, Any] | None:
        """The prompt's first block is not cached under its extra keys: were
        the same tokens stored under other ones?"""
        seen = self.firsts.get(first)
        if not seen:
            return None
        for other, rid in reversed(seen.items()):
            if other != tag:
                return {
                    "stored_with": _tag_json(other),
                    "requested_with": _tag_json(tag),
                    "with_request": rid,
                }
        return None


def _tag_json(tag: tuple[str | None, str | None]) -> dict[str, str | None]:
    return {"lora_name": tag[0], "cache_salt": tag[1]}
