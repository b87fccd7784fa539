"""Why a prompt block missed, what evictions cost (regret), where evicted
blocks had been in the free queue.

Every block of an admitted prompt that is not a prefix hit gets one reason:

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

Indexes, bounded: a ring of ``miss_index_size`` evictions (hash, block,
free-queue stamp, allocation serial, time, cause, taker; arrays, so the
garbage collector has nothing to walk) with a dict hash -> ring serial; a
log of free batches (first stamp, queue length before, allocation counter,
time) that turns a block's queue stamp into its queue position when freed;
per physical block, the request that last stored or went through it and
which of its blocks it was, with that request's token list held by
reference for a bounded number of recent requests (the floor); first-block
tokens -> the extra keys that stored them; root hash -> the last request
that used it.

Regret: a hash stored again while the eviction ring remembers its removal is
a regret, with the gap in seconds; counted per root prefix.
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from app.analysis.common import COUNT_BUCKETS, SECONDS_BUCKETS, Hist, h64, hex64, trim_dict

if TYPE_CHECKING:
    from app.columns import BlockColumns
    from blockpool import BlockPool, HashFn

Tag = tuple[str | None, str | None]  # (lora name, cache salt)
REASONS = ("last_token", "block_size_floor", "cold", "evicted", "extra_keys", "chain_broken")
HIT, LAST_TOKEN, FLOOR, COLD, EVICTED, EXTRA_KEYS, CHAIN_BROKEN = range(7)
CODE_NAMES = (None, *REASONS)
CAUSES = ("reuse", "evict_op", "reset")
REUSE, EVICT_OP, RESET = range(3)
GID0 = b"\0\0\0\0"
RECENT_REGRETS = 200
TOP_ROOTS_KEPT = 10_000


@dataclass
class RequestMisses:
    """Hit / miss reason per prompt block of one admitted request."""

    request_id: str
    ts: float
    num_tokens: int
    num_hit_blocks: int
    codes: bytes  # one per prompt block: 0 hit, else REASONS[code - 1]
    details: dict[int, Any] | None  # block index -> detail dict, or an eviction's ring serial
    lora_name: str | None = None
    cache_salt: str | None = None
    finished_ts: float | None = None
    rec: int = -1  # its record in the floor index

    def counts(self) -> dict[str, int]:
        c = self.codes
        return {name: c.count(code) for code, name in enumerate(REASONS, start=1) if code in c}


@dataclass
class _RootRegret:
    root: int
    regrets: int = 0
    gap_sum: float = 0.0
    last_gap: float = 0.0
    last_ts: float = 0.0
    max_depth: int = 0
    last_victim: str | None = None
    last_owner: str | None = None
    first_tokens: list[int] = field(default_factory=list)
    lora_name: str | None = None
    cache_salt: str | None = None


class MissTracker:
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
        self.cols = columns
        self.hash_fn = hash_fn
        self.bs = block_size
        self.hbs = pool.hash_block_size
        self.size = index_size
        self.finished_kept = finished_kept
        # aggregates
        self.blocks = [0] * 7  # per code (0 = hit)
        self.tokens = [0] * 7
        self.admissions = 0
        # evicted misses: how long ago, how far they had travelled (at tick time)
        self.ago = Hist(SECONDS_BUCKETS)
        self.miss_pos = Hist(COUNT_BUCKETS)
        self.miss_allocs = Hist(COUNT_BUCKETS)
        self.floor_shared = Hist(tuple(float(i) for i in range(1, block_size + 1)))
        self._pending_misses: list[tuple[int, float]] = []  # (ring serial, miss time)
        # every eviction: travel through the queue (at tick time)
        self.evictions = [0, 0, 0]  # per cause
        self.ev_pos = Hist(COUNT_BUCKETS)
        self.ev_allocs = Hist(COUNT_BUCKETS)
        self.ev_queue_s = Hist(SECONDS_BUCKETS)
        self._processed = 0
        # the eviction ring (plain lists: scalar writes are cheap; numpy at tick time)
        # (array.array: untracked by the garbage collector, cheap scalar writes)
        e = index_size
        self.r_h64 = array("Q", bytes(8 * e))
        self.r_bid = array("q", bytes(8 * e))
        self.r_stamp = array("q", bytes(8 * e))
        self.r_alloc = array("q", bytes(8 * e))
        self.r_ts = array("d", bytes(8 * e))
        self.r_cause = array("b", bytes(e))
        self.r_by: list[str | None] = [None] * e
        # numpy views of the same memory, for bulk writes and tick-time reads
        self.v_h64 = np.frombuffer(self.r_h64, dtype=np.uint64)
        self.v_bid = np.frombuffer(self.r_bid, dtype=np.int64)
        self.v_stamp = np.frombuffer(self.r_stamp, dtype=np.int64)
        self.v_alloc = np.frombuffer(self.r_alloc, dtype=np.int64)
        self.v_ts = np.frombuffer(self.r_ts, dtype=np.float64)
        self.v_cause = np.frombuffer(self.r_cause, dtype=np.int8)
        self.ev_serial = 0
        self.evicted: dict[int, int] = {}  # h64 -> ring serial
        # free batches: stamps -> queue position when freed
        cap = 1 << 16
        self.fb_first = np.zeros(cap, dtype=np.int64)
        self.fb_count = np.zeros(cap, dtype=np.int64)
        self.fb_nf = np.zeros(cap, dtype=np.int64)
        self.fb_alloc = np.zeros(cap, dtype=np.int64)
        self.fb_ts = np.zeros(cap, dtype=np.float64)
        self.fb_len = 0
        # floor / extra keys / owners
        # the floor: for each physical block, the request that last stored it
        # or went through it (a record: its token list, kept by reference) and
        # which of its blocks it was, so the tokens that followed are known.
        # Records are bounded by count and by tokens held.
        n = pool.num_gpu_blocks
        self.cont_rec = np.full(n, -1, dtype=np.int64)
        self.cont_pos = np.zeros(n, dtype=np.int64)
        self.recs: OrderedDict[int, tuple[list[int], str]] = OrderedDict()
        self.rec_tokens = 0
        self.recs_max = max(1024, 2 * n)
        self.rec_tokens_max = max(1 << 18, 16 * n)
        self.next_rec = 0
        self.root_latest: dict[Tag, tuple[tuple[int, ...], str]] = {}  # first blocks per keys
        # first block's tokens -> {(lora, salt): (tokens, tokens stored, request)}
        self.firsts: dict[tuple[int, ...], dict[Tag, str]] = {}
        self.root_owner: dict[int, str] = {}
        # requests
        self.running: dict[str, RequestMisses] = {}
        self.finished: OrderedDict[str, RequestMisses] = OrderedDict()
        # regret
        self.regrets = 0
        self.regret_gap = Hist(SECONDS_BUCKETS)
        self._pending_gaps: list[float] = []
        self.recent_regrets: deque[tuple[float, int, float, int, str | None, int]] = deque(
            maxlen=RECENT_REGRETS
        )
        self.roots: dict[int, _RootRegret] = {}

    # ------------------------------------------------------------ the queue

    def note_freed(
        self, first_stamp: int, count: int, nf_before: int, alloc: int, ts: float
    ) -> None:
        """Blocks got queue stamps ``first_stamp .. +count`` (appended at the
        tail in that order, after ``nf_before`` free blocks)."""
        if count <= 0:
            return
        i = self.fb_len
        if i == len(self.fb_first):
            half = i // 2
            for arr in (self.fb_first, self.fb_count, self.fb_nf, self.fb_alloc, self.fb_ts):
                arr[: i - half] = arr[half:i]
            i = self.fb_len = i - half
        self.fb_first[i] = first_stamp
        self.fb_count[i] = count
        self.fb_nf[i] = nf_before
        self.fb_alloc[i] = alloc
        self.fb_ts[i] = ts
        self.fb_len = i + 1

    def _travel(self, stamps: np.ndarray, allocs: np.ndarray, ts: np.ndarray) -> tuple[Any, ...]:
        """Vectorised: (ok mask, queue position when freed, allocations
        between free and eviction, seconds in the queue)."""
        n = self.fb_len
        first = self.fb_first[:n]
        b = np.searchsorted(first, stamps, side="right") - 1
        ok = b >= 0
        b = np.where(ok, b, 0)
        ok &= stamps < first[b] + self.fb_count[b]
        pos = self.fb_nf[b] + stamps - first[b]
        between = allocs - self.fb_alloc[b]
        in_queue = np.maximum(ts - self.fb_ts[b], 0.0)
        return ok, pos, between, in_queue

    # ------------------------------------------------------------ evictions

    def record_evictions(
        self, new_ids: list[int], alloc_base: int, cause: int, by: str | None, now: float
    ) -> list[int]:
        """The blocks in ``new_ids`` (in pop order) were just taken; those the
        (not yet synced) columns show hashed lost their hash.  Returns the
        hashes (64-bit) evicted."""
        cols = self.cols
        hashed = cols.hashed
        if len(new_ids) <= 4:
            hv = []
            for k, b in enumerate(new_ids):
                if hashed[b]:
                    v = int(cols.hash64[b])
                    s = self.ev_serial
                    j = s % self.size
                    self.r_bid[j] = b
                    self.r_h64[j] = v
                    self.r_stamp[j] = int(cols.stamp[b])
                    self.r_alloc[j] = alloc_base + k
                    self.r_ts[j] = now
                    self.r_cause[j] = cause
                    self.r_by[j] = by
                    self.evicted[v] = s
                    self.ev_serial = s + 1
                    self.evictions[cause] += 1
                    hv.append(v)
            if hv and len(self.evicted) > self.size + (self.size >> 2):
                floor = self.ev_serial - self.size
                self.evicted = {h: x for h, x in self.evicted.items() if x >= floor}
            return hv
        arr = np.array(new_ids, dtype=np.int64)
        posa = np.flatnonzero(hashed[arr])
        if not len(posa):
            return []
        ida = arr[posa]
        return self._ring_put(ida, posa + alloc_base, cause, by, now)

    def _ring_put(
        self, ida: np.ndarray, allocs: Any, cause: int, by: str | None, now: float
    ) -> list[int]:
        """Evictions of the blocks ``ida`` (pre-state read from the columns)."""
        cols = self.cols
        k = len(ida)
        e = self.size
        s0 = self.ev_serial
        hva = cols.hash64[ida]
        sta = cols.stamp[ida]
        ala = np.broadcast_to(np.asarray(allocs, dtype=np.int64), (k,))
        if k > e:  # more than the ring holds: keep the last e
            ida, hva, sta, ala = ida[-e:], hva[-e:], sta[-e:], ala[-e:]
            s0 += k - e
            k = e
        j = s0 % e
        first = min(k, e - j)
        for view, vals in (
            (self.v_bid, ida),
            (self.v_h64, hva),
            (self.v_stamp, sta),
            (self.v_alloc, ala),
        ):
            view[j : j + first] = vals[:first]
            if first < k:
                view[: k - first] = vals[first:]
        self.v_ts[j : j + first] = now
        self.v_cause[j : j + first] = cause
        self.r_by[j : j + first] = [by] * first
        if first < k:
            self.v_ts[: k - first] = now
            self.v_cause[: k - first] = cause
            self.r_by[: k - first] = [by] * (k - first)
        hv: list[int] = hva.tolist()
        ev = self.evicted
        ev.update(zip(hv, range(s0, s0 + k), strict=True))
        self.ev_serial = s0 + k
        self.evictions[cause] += k
        if len(ev) > e + (e >> 2):
            floor = self.ev_serial - e
            self.evicted = {h: x for h, x in ev.items() if x >= floor}
        return hv

    def record_reset(self, now: float, alloc: int) -> None:
        ids = np.flatnonzero(self.cols.hashed)
        if len(ids):
            self._ring_put(ids, alloc, RESET, None, now)

    def record_evict_op(self, ids: list[int], alloc: int, now: float) -> None:
        if ids:
            self._ring_put(np.array(ids, dtype=np.int64), alloc, EVICT_OP, "evict_op", now)

    def _eviction(self, hv: int) -> int:
        """The ring serial of the last remembered eviction of ``hv``, or -1."""
        s = self.evicted.get(hv)
        if s is None or s < self.ev_serial - self.size:
            return -1
        return s

    def eviction_info(self, serial: int, at: float) -> dict[str, Any]:
        """One eviction, seen from time ``at``; ``expired`` once the ring
        has moved past it."""
        if serial < self.ev_serial - self.size:
            return {"expired": True}
        j = serial % self.size
        ts = self.r_ts[j]
        cause = self.r_cause[j]
        info: dict[str, Any] = {
            "evicted_ago_seconds": max(0.0, at - ts),
            "evicted_at": ts,
            "cause": CAUSES[cause],
            "block_id": self.r_bid[j],
            "evicted_by": self.r_by[j],
            "queue_position_when_freed": None,
            "allocations_between": None,
            "touched_out_ahead": None,
            "seconds_in_queue": None,
        }
        if cause == REUSE and self.fb_len:
            ok, pos, between, in_queue = self._travel(
                np.array([self.r_stamp[j]]), np.array([self.r_alloc[j]]), np.array([ts])
            )
            if ok[0]:
                p, a = int(pos[0]), int(between[0])
                info.update(
                    queue_position_when_freed=p,
                    allocations_between=a,
                    touched_out_ahead=max(0, p - a),
                    seconds_in_queue=float(in_queue[0]),
                )
        return info

    def _ring_arrays(self, serials: list[int]) -> tuple[np.ndarray, ...]:
        idx = [s % self.size for s in serials]
        st, al, ts, ca = self.r_stamp, self.r_alloc, self.r_ts, self.r_cause
        return (
            np.array([st[j] for j in idx], dtype=np.int64),
            np.array([al[j] for j in idx], dtype=np.int64),
            np.array([ts[j] for j in idx], dtype=np.float64),
            np.array([ca[j] for j in idx], dtype=np.int64),
        )

    def _ring_range(self, start: int, end: int) -> tuple[np.ndarray, ...]:
        """Ring columns for serials ``start .. end`` (held ones), by slices."""
        e = self.size
        j0, j1 = start % e, end % e
        views = (self.v_stamp, self.v_alloc, self.v_ts, self.v_cause)
        if j0 < j1 or end - start == 0:
            return tuple(v[j0:j1].copy() for v in views)
        return tuple(np.concatenate((v[j0:], v[:j1])) for v in views)

    def process(self) -> None:
        """Tick time, vectorised: queue travel of the evictions since the last
        call, the evicted misses' age and travel, the regret gaps."""
        if self._pending_gaps:
            self.regret_gap.observe_many(self._pending_gaps)
            self._pending_gaps = []
        floor = self.ev_serial - self.size
        if self._pending_misses:
            pend = [(s, t) for s, t in self._pending_misses if s >= floor]
            self._pending_misses = []
            if pend:
                st, al, ts, ca = self._ring_arrays([s for s, _ in pend])
                at = np.array([t for _, t in pend], dtype=np.float64)
                self.ago.observe_many(np.maximum(at - ts, 0.0))
                if self.fb_len:
                    ok, pos, between, _ = self._travel(st, al, ts)
                    ok &= ca == REUSE
                    self.miss_pos.observe_many(pos[ok])
                    self.miss_allocs.observe_many(between[ok])
        end = self.ev_serial
        start = max(self._processed, floor)
        self._processed = end
        if start >= end or not self.fb_len:
            return
        st, al, ts, ca = self._ring_range(start, end)
        ok, pos, between, in_queue = self._travel(st, al, ts)
        ok &= ca == REUSE
        if ok.any():
            self.ev_pos.observe_many(pos[ok])
            self.ev_allocs.observe_many(between[ok])
            self.ev_queue_s.observe_many(in_queue[ok])

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

    def _floor(self, cand: Sequence[int], tokens: list[int], start: int) -> int:
        """Leading tokens ``cand`` shares with ``tokens[start:]``."""
        n = min(len(cand), len(tokens) - start)
        k = 0
        while k < n and cand[k] == tokens[start + k]:
            k += 1
        return k

    def _set_cont(self, ids: list[int], rec: int, lo: int) -> None:
        """Blocks ``lo ..`` of record ``rec``'s request sit in ``ids``."""
        if len(ids) > 8:
            idx = np.array(ids, dtype=np.int64)
            self.cont_rec[idx] = rec
            self.cont_pos[idx] = np.arange(lo, lo + len(ids), dtype=np.int64)
        else:
            cr, cp = self.cont_rec, self.cont_pos
            for k, x in enumerate(ids):
                cr[x] = rec
                cp[x] = lo + k

    def _new_rec(self, tokens: list[int], rid: str) -> int:
        rec = self.next_rec
        self.next_rec = rec + 1
        recs = self.recs
        recs[rec] = (tokens, rid)
        self.rec_tokens += len(tokens)
        while len(recs) > 1 and (
            len(recs) > self.recs_max or self.rec_tokens > self.rec_tokens_max
        ):
            _, (old, _) = recs.popitem(last=False)
            self.rec_tokens -= len(old)
        return rec

    def _cont(self, x: int) -> tuple[list[int], str | None]:
        """The tokens that followed physical block ``x`` (up to a block)."""
        got = self.recs.get(int(self.cont_rec[x]))
        if got is None:
            return [], None
        ref, rid = got
        start = (int(self.cont_pos[x]) + 1) * self.bs
        return ref[start : start + self.bs], rid

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
                if code == EVICTED:
                    regrets.append((i, info))
                elif i == 0 and first is not None and (found := self._other_keys(first, tag)):
                    code, info = EXTRA_KEYS, found
                elif code == COLD:
                    with_rid: str | None = None
                    cand: Sequence[int] = ()
                    if i == 0:
                        latest = self.root_latest.get(tag)
                        if latest is not None:
                            cand, with_rid = latest
                    else:
                        cand, with_rid = self._cont(ids0[i - 1])
                    shared = self._floor(cand, tokens, i * bs)
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
        blocks, toks = self.blocks, self.tokens
        cb = bytes(codes)
        for code in range(7):
            c = cb.count(code)
            if c:
                blocks[code] += c
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
            self._regret(hashes, regrets, now, rid, root, owner, tokens, lora, salt)
        # indexes
        rec = self._new_rec(all_tokens, rid)
        lo = num_hit - 1 if num_hit else 0
        if full > lo:
            self._set_cont(ids0[lo:full], rec, lo)
        if first is not None:
            self.root_latest[tag] = (first, rid)
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
        hv = [int.from_bytes(h[-8:], "big") for h in hs]
        serials = list(map(self.evicted.get, hv))
        floor = self.ev_serial - self.size
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
        """A full block whose hash is not cached: evicted (with its ring
        serial) or cold."""
        serial = self._eviction(h64(h))
        if serial >= 0:
            return EVICTED, serial
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

    def _regret(
        self,
        hashes: Any,
        found: list[tuple[int, int]],
        now: float,
        victim: str | None,
        root: int,
        owner: str | None,
        tokens: list[int] | None,
        lora: str | None,
        salt: str | None,
    ) -> None:
        """Hashes (``hashes[i]`` for each (i, ring serial) in ``found``)
        stored again after their eviction."""
        size, r_ts, ev = self.size, self.r_ts, self.evicted
        gaps = self._pending_gaps
        recent = self.recent_regrets
        gap_sum = 0.0
        depth = 0
        gap = 0.0
        for i, serial in found:
            hv = int.from_bytes(hashes[i][-8:], "big")
            gap = now - r_ts[serial % size]
            if gap < 0:
                gap = 0.0
            ev.pop(hv, None)
            gaps.append(gap)
            gap_sum += gap
            depth = max(depth, i)
            recent.append((now, hv, gap, i, victim, root))
        self.regrets += len(found)
        agg = self.roots.get(root)
        if agg is None:
            if len(self.roots) >= TOP_ROOTS_KEPT:
                keep = heapq.nlargest(TOP_ROOTS_KEPT // 2, self.roots.values(), key=_by_regrets)
                self.roots = {r.root: r for r in keep}
            agg = self.roots[root] = _RootRegret(
                root,
                first_tokens=list(tokens[:16]) if tokens is not None else [],
                lora_name=lora,
                cache_salt=salt,
            )
        agg.regrets += len(found)
        agg.gap_sum += gap_sum
        agg.last_gap = gap
        agg.last_ts = now
        agg.max_depth = max(agg.max_depth, depth)
        agg.last_victim = victim
        if owner is not None and owner != victim:
            agg.last_owner = owner

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
        ev = self.evicted
        found: list[tuple[int, int]] = []
        for j in range(old_cached, new_cached):
            if ev:
                serial = self._eviction(h64(hashes[j]))
                if serial >= 0:
                    found.append((j, serial))
        if found:
            self._regret(hashes, found, now, rid, h64(hashes[0]), None, all_tokens, lora, salt)

    def on_stored(self, hashes: Sequence[bytes], now: float) -> None:
        """Hashes cached through the raw block API (regret check only)."""
        found = [(i, s) for i, h in enumerate(hashes) if (s := self._eviction(h64(h))) >= 0]
        if found:
            self._regret(hashes, found, now, None, h64(hashes[0]), None, None, None, None)

    def on_finish(self, rid: str, all_tokens: list[int], table0: list[Any], now: float) -> None:
        rm = self.running.pop(rid, None)
        # what followed its blocks since the admission: decode tokens, the tail
        full = len(all_tokens) // self.bs
        if rm is not None and rm.rec in self.recs:
            lo = max(0, rm.num_tokens // self.bs - 1)
            if full > lo:
                self._set_cont([b.block_id for b in table0[lo:full]], rm.rec, lo)
            self.rec_tokens += len(all_tokens) - rm.num_tokens
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
                d = self.eviction_info(d, rm.ts)
            out.append((CODE_NAMES[c], d))
        return out

    def totals(self) -> dict[str, Any]:
        return {
            name: {"blocks": self.blocks[code], "tokens": self.tokens[code]}
            for code, name in enumerate(REASONS, start=1)
        }

    def top_roots(self, limit: int) -> list[_RootRegret]:
        return heapq.nlargest(limit, self.roots.values(), key=_by_regrets)

    def evicted_remembered(self) -> int:
        floor = self.ev_serial - self.size
        return sum(1 for s in self.evicted.values() if s >= floor)

    def recent_regret_rows(self, limit: int) -> list[dict[str, Any]]:
        rows = list(self.recent_regrets)[-limit:]
        return [
            {
                "ts": ts,
                "hash64": hex64(hv),
                "gap_seconds": gap,
                "block_index": depth,
                "request_id": victim,
                "root": hex64(root),
            }
            for ts, hv, gap, depth, victim, root in reversed(rows)
        ]


def _by_regrets(r: _RootRegret) -> tuple[int, float]:
    return (r.regrets, r.last_ts)


def _tag_json(tag: tuple[str | None, str | None]) -> dict[str, str | None]:
    return {"lora_name": tag[0], "cache_salt": tag[1]}


__all__ = ["CODE_NAMES", "REASONS", "MissTracker", "RequestMisses"]
