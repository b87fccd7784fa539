"""Why a real engine's requests missed: the miss reasons of a mirrored engine.

The engine's plugin sends each request's block hashes and prompt length at
arrival, and its prefix hit when first scheduled -- no token ids.  When a
request's first scheduling arrives, before the operations of that step are
applied, its prompt blocks are classified against the mirrored pool as the
step found it (the reasons' names are those of the simulated pool's,
``miss_classifier.py``):

``last_token``
    Cached, every earlier block hit, but it holds the last prompt token.
``block_size_floor``
    The partial tail block (never hashed).
``evicted`` / ``reset``
    Its hash was cached in the mirrored pool and an allocation (or the
    evict operation) took it since -- or a prefix-cache reset dropped it; the
    detail says when, which block held it and why.  A hash cached when the
    step began but missed anyway was evicted in that step (``in_step``).
``chain_broken``
    Still cached, but an earlier block missed.
``cold``
    Never cached while the mirror watched (within the eviction memory);
    every later block then is cold too.
``skipped``
    The engine did not look the prompt up at all (``Arrive.skips_cache``:
    vLLM's ``prompt_logprobs`` requests): every full block after the hit
    ones; the detail says whether its hash was cached (it would have hit).

Not told by hashes alone: ``extra_keys`` and the shared-token floor (both
need the prompt's tokens, which never leave the engine).

The eviction memory is the analysis' own (``EvictionRing``): where the
runtime has an inline ``Analysis``, its ring, which the analysis keeps as
the runtime's observer; else a ring of its own, kept the same way -- this
object is then one of the runtime's observers (``EngineMisses.observing``).
Synchronous: the service's one writer calls ``classify`` (before it
applies the step) and the runtime tells the observer of every change.

The evicted misses' age and queue travel (``evicted_misses`` of ``view``,
the page's two charts) are taken when a request is classified, from the
ring's record of each evicted block: how long before the miss it was
evicted, and -- through the log of free batches, for evictions by reuse --
where it had entered the free queue and the allocations between.  An own
ring's free batches are this observer's to log (as ``Analysis`` logs them).
A block evicted in the request's own step (``in_step``) has no record yet:
neither chart counts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from blockpool.analysis.common import h64
from blockpool.analysis.evictions import EvictionRing
from blockpool.analysis.free_batches import FreeBatches
from blockpool.analysis.miss_travel import MissTravel
from blockpool.analysis.views import MissCounts
from blockpool.common.miss_reasons import (
    CAUSES,
    CHAIN_BROKEN,
    CODE_NAMES,
    COLD,
    EVICTED,
    FLOOR,
    LAST_TOKEN,
    NUM_CODES,
    REASONS,
    RESET,
    RESET_DROP,
    REUSE,
    SKIPPED,
    MissTally,
)
from blockpool.core.hashing import BlockHashWithGroupId
from blockpool.runtime.observer import OpObserver

if TYPE_CHECKING:
    from blockpool.analysis.core import Analysis
    from blockpool.core.manager import Admission, ManagedRequest
    from blockpool.runtime.observer import AdmitFields
    from blockpool.runtime.runtime import PoolRuntime

GID0 = b"\0\0\0\0"  # group 0's id, the end of a map key
REMEMBERED = 65_536  # evictions an own ring remembers


def key0(h: bytes) -> BlockHashWithGroupId:
    """The map key of hash ``h`` in group 0."""
    return BlockHashWithGroupId(h + GID0)


class EngineMissCounts(MissCounts):
    """``Misses``' counts of the engine's requests, over the mirror's own."""

    engine_requests: bool
    dropped_hashes_remembered: int


class EngineMisses(OpObserver):
    """The engine's requests' miss reasons and their tally (see the module doc)."""

    def __init__(
        self,
        rt: PoolRuntime,
        ring: EvictionRing | None = None,
        *,
        remembered: int = REMEMBERED,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rt = rt
        self.bs = rt.config.block_size
        self.clock = clock
        # None: a ring of its own, which this observer keeps (``records``)
        self.records = ring is None
        self.ring = (
            ring if ring is not None else EvictionRing(rt.columns, remembered, FreeBatches())
        )
        self.batches = self.ring.batches  # an own ring's: logged here (``on_freed``)
        self.tally = MissTally()
        self.blocks = self.tally.blocks  # per code (0 = hit)
        self.tokens = [0] * NUM_CODES
        self.admissions = 0
        # evicted misses: how long ago, how far the block had travelled
        self.travel = MissTravel()
        if self.records:
            self._rebase()

    @classmethod
    def observing(
        cls, rt: PoolRuntime, analysis: Analysis | None = None, **kwargs: Any
    ) -> EngineMisses:
        """The engine's misses on ``rt``: sharing ``analysis``' eviction ring
        (the runtime's inline analysis keeps it), else keeping one as one of
        the runtime's observers."""
        if analysis is not None:
            if analysis.rt is not rt:
                raise ValueError("the analysis observes another runtime")
            return cls(rt, analysis.misses.ring, **kwargs)
        misses = cls(rt, None, **kwargs)
        rt.observe(misses)
        return misses

    # ---------------------------------------- the runtime's notifications

    def _rebase(self) -> None:
        """The free queue as the columns stamp it now is one batch (as
        ``Analysis.rebase``: start-up, a resync)."""
        cols = self.rt.columns
        free = self.rt.pool.get_num_free_blocks()
        alloc = self.rt.counters.blocks_allocated
        self.batches.note_freed(cols.next_stamp - cols.num_blocks, free, 0, alloc, self.clock())

    def on_freed(self, first_stamp: int, now: float | None = None) -> None:
        if self.records:
            rt = self.rt
            count = rt.columns.next_stamp - first_stamp
            if count > 0:
                nf_before = rt.pool.get_num_free_blocks() - count
                self.batches.note_freed(
                    first_stamp, count, nf_before, rt.counters.blocks_allocated,
                    now or self.clock(),
                )  # fmt: skip

    def on_finish(self, rid: str, managed: ManagedRequest, first_stamp: int) -> None:  # noqa: ARG002 the runtime observer's protocol
        self.on_freed(first_stamp)

    def on_allocate(self, ids: list[int]) -> None:
        if self.records:
            alloc = self.rt.counters.blocks_allocated
            self.ring.record_evictions(ids, alloc, REUSE, None, self.clock())

    def on_admit(self, rid: str, op: AdmitFields, adm: Admission) -> None:  # noqa: ARG002 the runtime observer's protocol
        if self.records:
            hit = adm.num_hit_blocks
            new = [b for t in adm.block_ids for b in t[hit:]]
            alloc = self.rt.counters.blocks_allocated
            self.ring.record_evictions(new, alloc, REUSE, rid, self.clock())

    def on_append(
        self,
        rid: str,
        managed: ManagedRequest,  # noqa: ARG002 the runtime observer's protocol
        before_tokens: int,  # noqa: ARG002 the runtime observer's protocol
        before_cached: int,  # noqa: ARG002 the runtime observer's protocol
        added: list[list[int]],
    ) -> None:
        new = [b for t in added for b in t]
        if self.records and new:
            alloc = self.rt.counters.blocks_allocated
            self.ring.record_evictions(new, alloc, REUSE, rid, self.clock())

    def on_evict(self, ids: list[int]) -> None:
        if self.records:
            self.ring.record_evict_op(ids, self.rt.counters.blocks_allocated, self.clock())

    def on_reset(self) -> None:
        if self.records:
            rt = self.rt
            now = self.clock()
            self.ring.record_reset(now, rt.counters.blocks_allocated)
            # the columns' resync stamps the whole queue, in order, from next_stamp
            self.batches.note_freed(
                rt.columns.next_stamp, rt.pool.get_num_free_blocks(), 0,
                rt.counters.blocks_allocated, now,
            )  # fmt: skip

    def on_resync(self) -> None:
        """An eviction remembered of a hash cached again now is forgotten
        (as ``Analysis.on_resync`` does for the ring it shares)."""
        ring = self.ring
        if not self.records:
            return
        self._rebase()
        if not ring.evicted:
            return
        cols = self.rt.columns
        cached = set(cols.hash64[np.flatnonzero(cols.hashed)].tolist())
        if cached:
            ring.evicted = {h: s for h, s in ring.evicted.items() if h not in cached}

    # -------------------------------------------------------- classification

    def classify(
        self,
        hashes: list[bytes],
        prompt: int,
        hit_tokens: int,
        now: float | None = None,
        *,
        skips_cache: bool = False,
    ) -> tuple[list[str | None], dict[int, dict[str, Any]]]:
        """A request first scheduled now, before its step's operations apply:
        (reason or None for a hit, per prompt block; details by block)."""
        when = self.clock() if now is None else now
        bs = self.bs
        cached = self.rt.pool.cached_block_hash_to_block.get_one_block
        full = min(prompt // bs, len(hashes))
        total = -(-prompt // bs)
        num_hit = min(hit_tokens // bs, full)
        codes = [0] * total
        details: dict[int, dict[str, Any]] = {}
        evicted: list[int] = []  # ring serials of the evicted misses
        if skips_cache:
            for j in range(num_hit, full):
                codes[j] = SKIPPED
                details[j] = {"cached": cached(key0(hashes[j])) is not None}
        elif num_hit < full:
            self._misses(hashes, num_hit, full, (prompt - 1) // bs, when, codes, details, evicted)
            if evicted:
                self._travel(evicted, when)
        for j in range(full, total):  # the partial tail (or hashes not sent)
            codes[j] = FLOOR
            tail = prompt - j * bs
            if tail < bs:
                details[j] = {"partial": True, "tokens": tail}
        self.tally.add_codes(bytes(codes))
        tokens = self.tokens
        for j, c in enumerate(codes):
            tokens[c] += min(bs, prompt - j * bs)
        self.admissions += 1
        return [CODE_NAMES[c] for c in codes], details

    def _misses(
        self,
        hashes: list[bytes],
        i: int,
        full: int,
        max_hit: int,
        now: float,
        codes: list[int],
        details: dict[int, dict[str, Any]],
        evicted: list[int],
    ) -> None:
        """Blocks ``i .. full`` (``i``: the first miss); ``evicted`` gets the
        ring serials of the evicted ones."""
        cached = self.rt.pool.cached_block_hash_to_block.get_one_block
        if cached(key0(hashes[i])) is not None:
            codes[i] = LAST_TOKEN if i == max_hit else EVICTED
            if codes[i] == EVICTED:
                details[i] = {"in_step": True}
        else:
            codes[i] = self._history(hashes[i], now, details, i, evicted)
        if codes[i] == COLD:
            codes[i:full] = [COLD] * (full - i)
            return
        for j in range(i + 1, full):
            if cached(key0(hashes[j])) is not None:
                codes[j] = CHAIN_BROKEN
                continue
            codes[j] = self._history(hashes[j], now, details, j, evicted)
            if codes[j] == COLD:
                codes[j:full] = [COLD] * (full - j)
                return

    def _history(
        self, h: bytes, now: float, details: dict[int, Any], i: int, evicted: list[int]
    ) -> int:
        """A hash not cached now: what the eviction memory says of it."""
        ring = self.ring
        serial = ring.eviction(h64(h))
        if serial < 0:
            return COLD
        j = serial % ring.size
        cause = int(ring.r_cause[j])
        details[i] = {
            "cause": CAUSES[cause],
            "evicted_ago_seconds": max(0.0, now - ring.r_ts[j]),
            "block_id": int(ring.r_bid[j]),
        }
        if cause == RESET:
            return RESET_DROP
        evicted.append(serial)
        return EVICTED

    def _travel(self, serials: list[int], now: float) -> None:
        """The evicted misses' age and, for evictions by reuse, their queue
        travel (the log of free batches; as ``Misses.process``)."""
        self.travel.observe(self.ring, self.batches, serials, now)

    # ----------------------------------------------------------------- views

    def section(self) -> dict[str, Any]:
        """The stream's ``analysis`` figures of the miss reasons (the engine's)."""
        return {
            "misses": {name: self.blocks[c] for c, name in enumerate(REASONS, start=1)},
            "miss_tokens": {name: self.tokens[c] for c, name in enumerate(REASONS, start=1)},
            "hit_blocks": self.blocks[0],
        }

    def view(self) -> EngineMissCounts:
        """What ``GET /api/misses`` says of the engine's requests."""
        missed = sum(self.blocks[1:])
        return {
            "admissions": self.admissions,
            "hit": {"blocks": self.blocks[0], "tokens": self.tokens[0]},
            "missed": {"blocks": missed, "tokens": sum(self.tokens[1:])},
            "reasons": {
                name: {
                    "blocks": self.blocks[c],
                    "tokens": self.tokens[c],
                    "share": self.blocks[c] / missed if missed else 0.0,
                }
                for c, name in enumerate(REASONS, start=1)
            },
            "evicted_misses": {
                "ago_seconds": self.travel.ago.as_json(),
                "queue_position_when_freed": self.travel.miss_pos.as_json(),
                "allocations_between": self.travel.miss_allocs.as_json(),
            },
            "engine_requests": True,
            "dropped_hashes_remembered": self.ring.evicted_remembered(),
        }
