"""The miss tracker: each admitted prompt's blocks get a reason (the
classifier and the reasons: ``miss_classifier.py``; the codes:
``reasons.py``), and the aggregates of its answers.

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

from blockpool.analysis.common import Hist, h64, trim_dict
from blockpool.analysis.evictions import EvictionRing
from blockpool.analysis.floor import FloorIndex
from blockpool.analysis.free_batches import FreeBatches
from blockpool.analysis.miss_classifier import MissClassifier
from blockpool.analysis.miss_travel import MissTravel
from blockpool.analysis.regret import RegretTracker
from blockpool.common.miss_reasons import (
    CODE_NAMES,
    FLOOR,
    NUM_CODES,
    REASONS,
    MissTally,
    RequestMissCodes,
    Tag,
)

if TYPE_CHECKING:
    from blockpool import BlockPool, HashFn
    from blockpool.runtime.columns import BlockColumns


class MissTracker:
    """Classifies each admitted prompt's blocks (``classifier``) and keeps
    the aggregates; owns the bounded indexes it reads (``batches``, ``ring``,
    ``floor``) and the regret it finds (``regret``)."""

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
        self.travel = MissTravel()
        self.ago, self.miss_pos, self.miss_allocs = (
            self.travel.ago,
            self.travel.miss_pos,
            self.travel.miss_allocs,
        )
        self.floor_shared = Hist(tuple(float(i) for i in range(1, block_size + 1)))
        self._pending_misses: list[tuple[int, float]] = []  # (ring serial, miss time)
        # extra keys / owners
        # first block's tokens -> {(lora, salt): the last request that stored them}
        self.firsts: dict[tuple[int, ...], dict[Tag, str]] = {}
        self.root_owner: dict[int, str] = {}
        self.classifier = MissClassifier(
            pool, self.ring, self.floor, self.firsts, block_size, self.floor_shared
        )
        # requests
        self.running: dict[str, RequestMissCodes] = {}
        self.finished: OrderedDict[str, RequestMissCodes] = OrderedDict()

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
                at = np.array([t for _, t in pend], dtype=np.float64)
                self.travel.observe(ring, self.batches, [s for s, _ in pend], at)
        ring.process()

    # ------------------------------------------------------------ requests

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
    ) -> RequestMissCodes:
        """Classify the prompt's blocks (after the admission, before the
        engine's columns are synced; ``evicted_now``: hashes this admission's
        allocation evicted) and update the indexes."""
        bs = self.bs
        fl = self.floor
        n = len(tokens)
        full = n // bs
        tag = (lora, salt)
        first = tuple(tokens[:bs]) if full else None
        codes, details, regrets = self.classifier.classify(
            tokens, ids0, tag, first, hashes, table0, num_hit, evicted_now
        )
        tail = n - full * bs
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
        rm = RequestMissCodes(rid, now, n, num_hit, cb, details, lora, salt, None, rec)
        self.running[rid] = rm
        return rm

    def on_append(
        self,
        rid: str,
        all_tokens: list[int],
        hashes: Any,
        table0: list[Any],  # noqa: ARG002 the observer protocol's signature
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

    def lookup(self, rid: str) -> RequestMissCodes | None:
        return self.running.get(rid) or self.finished.get(rid)

    def block_reasons(self, rm: RequestMissCodes) -> list[tuple[str | None, dict[str, Any] | None]]:
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
