"""Why a prompt block missed: the reason classifier, and the aggregates of
its answers.

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

Indexes, bounded: the eviction ring (``evictions.py``) with the log of free
batches that turns a block's queue stamp into its queue position when freed
(``free_batches.py``); per physical block, the request that last stored or
went through it (the floor: ``floor.py``); first-block tokens -> the extra
keys that stored them; root hash -> the last request that used it.  A hash
stored again while the ring remembers its eviction is a regret
(``regret.py``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from blockpool.analysis.common import COUNT_BUCKETS, SECONDS_BUCKETS, Hist, h64, trim_dict
from blockpool.analysis.evictions import EvictionRing
from blockpool.analysis.floor import FloorIndex
from blockpool.analysis.free_batches import FreeBatches
from blockpool.analysis.regret import RegretTracker
from blockpool.common.keys import digest64
from blockpool.common.miss_reasons import (
    CHAIN_BROKEN,
    CODE_NAMES,
    COLD,
    EVICTED,
    EXTRA_KEYS,
    FLOOR,
    LAST_TOKEN,
    NUM_CODES,
    REASONS,
    RESET_DROP,
    MissTally,
)
from blockpool.common.reasons import REUSE, RequestMisses, Tag

if TYPE_CHECKING:
    from blockpool import BlockPool, HashFn
    from blockpool.runtime.columns import BlockColumns

GID0 = b"\0\0\0\0"


class MissTracker:
    """Classifies each admitted prompt's blocks and keeps the aggregates; owns
    the bounded indexes it reads (``batches``, ``ring``, ``floor``) and the
    regret it finds (``regret``)."""

    def __init__(
        self,
        pool: BlockPool,
        columns: BlockColumns,
        hash_fn: HashFn,
        block_size: int,
        index_size: int,
        finished_kept: int,
    ) -> None:
        self.pool = pool
        self.hash_fn = hash_fn
        self.bs = block_size
        self.size = index_size
        self.finished_kept = finished_kept
        # the indexes: free batches, evictions, the floor; regret
        self.batches = FreeBatches()
        self.ring = EvictionRing(columns, index_size, self.batches)
        self.floor = FloorIndex(pool.num_gpu_blocks, block_size)
        self.regret = RegretTracker(self.ring)
        # aggregates
        self.tally = MissTally()
        self.blocks = self.tally.blocks  # per code (0 = hit)
        self.tokens = [0] * NUM_CODES
        self.admissions = 0
        # evicted misses: how long ago, how far they had travelled (at tick time)
        self.ago = Hist(SECONDS_BUCKETS)
        self.miss_pos = Hist(COUNT_BUCKETS)
        self.miss_allocs = Hist(COUNT_BUCKETS)
        self.floor_shared = Hist(tuple(float(i) for i in range(1, block_size + 1)))
        self._pending_misses: list[tuple[int, float]] = []  # (ring serial, miss time)
        # extra keys / owners
        # first block's tokens -> {(lora, salt): the last request that stored them}
        self.firsts: dict[tuple[int, ...], dict[Tag, str]] = {}
        self.root_owner: dict[int, str] = {}
        # requests
        self.running: dict[str, RequestMisses] = {}
        self.finished: OrderedDict[str, RequestMisses] = OrderedDict()

    def process(self) -> None:
        """Tick time, vectorised: the regret gaps, the evicted misses' age and
        travel, queue travel of the evictions since the last call."""
        self.regret.process()
        ring = self.ring
        floor = ring.ev_serial - ring.size
        if self._pending_misses:
            pend = [(s, t) for s, t in self._pending_misses if s >= floor]
            self._pending_misses = []
            if pend:
                st, al, ts, ca = ring.ring_arrays([s for s, _ in pend])
                at = np.array([t for _, t in pend], dtype=np.float64)
                self.ago.observe_many(np.maximum(at - ts, 0.0))
                if self.batches.fb_len:
                    ok, pos, between, _ = self.batches.travel(st, al, ts)
                    ok &= ca == REUSE
                    self.miss_pos.observe_many(pos[ok])
                    self.miss_allocs.observe_many(between[ok])
        ring.process()

    # -------------------------------------------------------------- reasons

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

    def on_admit(
        self,
        rid: str,
        tokens: list[int],
        all_tokens: list[int],
        ids0: list[int],
        lora: str | None,
        salt: str | None,
        hashes: Any,
        table0: list[Any],
        num_hit: int,
        evicted_now: list[int],
        now: float,
    ) -> RequestMisses:
        """Classify the prompt's blocks (after the admission, before the
        engine's columns are synced; ``evicted_now``: hashes this admission's
        allocation evicted) and update the indexes."""
        bs = self.bs
        fl = self.floor
        n = len(tokens)
        full = n // bs
        total = -(-n // bs)
        codes = bytearray(total)
        details: dict[int, Any] | None = None
        tag = (lora, salt)
        first = tuple(tokens[:bs]) if full else None
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
        # aggregates
        toks = self.tokens
        cb = bytes(codes)
        for code, c in enumerate(self.tally.add_codes(cb)):
            toks[code] += c * bs
        if tail:
            toks[FLOOR] -= bs - tail
        self.admissions += 1
        root = h64(hashes[0]) if full else 0
        if regrets:
            pm = self._pending_misses
            for _, serial in regrets:
                pm.append((serial, now))
            owner = self.root_owner.get(root) if full else None
            self.regret.record(hashes, regrets, now, rid, root, owner, tokens, lora, salt)
        # indexes
        rec = fl.new_rec(all_tokens, rid)
        lo = num_hit - 1 if num_hit else 0
        if full > lo:
            fl.set_cont(ids0[lo:full], rec, lo)
        if first is not None:
            fl.root_latest[tag] = (first, rid)
        if first is not None:
            fi = self.firsts.get(first)
            if fi is None:
                fi = self.firsts[first] = {}
                if len(self.firsts) > self.size:
                    trim_dict(self.firsts, self.size // 2)
            fi[tag] = rid
        if full:
            ro = self.root_owner
            ro.pop(root, None)
            ro[root] = rid
            if len(ro) > self.size:
                trim_dict(ro, self.size // 2)
        rm = RequestMisses(rid, now, n, num_hit, cb, details, lora, salt, None, rec)
        self.running[rid] = rm
        return rm

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

    def on_append(
        self,
        rid: str,
        all_tokens: list[int],
        hashes: Any,
        table0: list[Any],
        old_cached: int,
        new_cached: int,
        now: float,
    ) -> None:
        """Decode blocks ``old_cached .. new_cached`` were stored."""
        if new_cached <= old_cached:
            return
        rm = self.running.get(rid)
        lora = rm.lora_name if rm else None
        salt = rm.cache_salt if rm else None
        ring = self.ring
        ev = ring.evicted
        found: list[tuple[int, int]] = []
        for j in range(old_cached, new_cached):
            if ev:
                serial = ring.eviction(h64(hashes[j]))
                if serial >= 0 and not ring.by_reset(serial):
                    found.append((j, serial))
        if found:
            self.regret.record(
                hashes, found, now, rid, h64(hashes[0]), None, all_tokens, lora, salt
            )

    def on_stored(self, hashes: Sequence[bytes], now: float) -> None:
        """Hashes cached through the raw block API (regret check only)."""
        ring = self.ring
        found = [
            (i, s)
            for i, h in enumerate(hashes)
            if (s := ring.eviction(h64(h))) >= 0 and not ring.by_reset(s)
        ]
        if found:
            self.regret.record(hashes, found, now, None, h64(hashes[0]), None, None, None, None)

    def on_finish(self, rid: str, all_tokens: list[int], table0: list[Any], now: float) -> None:
        rm = self.running.pop(rid, None)
        # what followed its blocks since the admission: decode tokens, the tail
        if rm is not None:
            self.floor.on_finish(rm.rec, rm.num_tokens, all_tokens, table0)
        if rm is None or not self.finished_kept:
            return
        rm.finished_ts = now
        fin = self.finished
        fin[rid] = rm
        while len(fin) > self.finished_kept:
            fin.popitem(last=False)

    # ---------------------------------------------------------------- views

    def lookup(self, rid: str) -> RequestMisses | None:
        return self.running.get(rid) or self.finished.get(rid)

    def block_reasons(self, rm: RequestMisses) -> list[tuple[str | None, dict[str, Any] | None]]:
        """(reason or None for a hit, detail) per prompt block."""
        det = rm.details or {}
        out: list[tuple[str | None, dict[str, Any] | None]] = []
        for i, c in enumerate(rm.codes):
            d = det.get(i)
            if isinstance(d, int):  # an eviction's ring serial
                d = self.ring.eviction_info(d, rm.ts)
            out.append((CODE_NAMES[c], d))
        return out

    def totals(self) -> dict[str, Any]:
        return {
            name: {"blocks": self.blocks[code], "tokens": self.tokens[code]}
            for code, name in enumerate(REASONS, start=1)
        }


def _tag_json(tag: tuple[str | None, str | None]) -> dict[str, str | None]:
    return {"lora_name": tag[0], "cache_salt": tag[1]}
