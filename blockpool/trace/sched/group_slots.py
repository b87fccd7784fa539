"""KV slots per request over several KV-cache groups (full attention and
sliding windows), as vLLM 0.16's ``KVCacheManager`` allocates them for a
hybrid model: the scheduler's :class:`~blockpool.trace.sched.slots.SlotBackend` on
a :class:`~blockpool.core.coordinator.KVCacheCoordinator`.

* ``lookup`` is ``get_computed_blocks``: the coordinator's longest hit no
  longer than ``num_tokens - 1`` tokens (a block list per group, null blocks
  where a window skips), counted in the lookup-level statistics as
  ``KVSlots`` counts them.
* ``allocate`` is ``allocate_slots`` for one chunk: blocks that fell out of
  a window freed first, then the blocks every group needs, or ``False``
  (only those frees done, as vLLM does) when the pool lacks them.  Full
  blocks are cached up to the tokens scheduled so far (at most the known
  tokens) unless ``cache=False``; asynchronous scheduling caches the rest
  when the sampled token arrives (``cache_blocks``).
* ``free`` gives every group's blocks back (a finish or a preemption).

Miss reasons, per prompt block of the hash block size: ``cold`` -- never
cached in any group; ``evicted`` -- cached in some group before, yet not in
the hit now: evicted from a group, or, for a sliding window, the run of
blocks the window needs was broken by an eviction even though this block
may still be cached; ``last_token`` -- the block after a hit at its limit
is cached in every group but holds the prompt's last token;
``block_size_floor`` -- the partial tail block.  A hit of a sliding-window
model may count blocks that no group holds (they lie before the window and
are null in the table): they are hits, as vLLM counts them.

A blocked head request is looked up again every step; its hit is a function
of the map entries of its own hashes, which change only when one of them is
cached or evicted.  Those changes are logged (evictions through the pool's
metrics-collector hook, when the pool has no collector of its own), and a
lookup whose request's hashes saw none since its last one returns that hit
again (counted again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blockpool.common.miss_reasons import MissTally
from blockpool.core.admission import cdiv
from blockpool.core.attention import FULL_ATTENTION, GroupSpec
from blockpool.core.block import KVCacheBlock
from blockpool.core.coordinator import KVCacheCoordinator
from blockpool.core.hashing import BlockHash
from blockpool.core.metrics import KVCacheMetricsCollector
from blockpool.core.pool import BlockPool
from blockpool.trace.replay.sequence_groups import is_plain
from blockpool.trace.sched.slots import LookupStats, MissArgs, SlotRequest, miss_args
from blockpool.trace.sizing.capacity import parse_kv_cache_groups


def needs_groups(specs: Sequence[GroupSpec]) -> bool:
    """Whether a layout needs the group slots (more than one group, or a
    window); one full-attention group runs on ``KVSlots``."""
    return not is_plain(specs)


def peak_blocks(specs: Sequence[GroupSpec], num_tokens: int, max_chunk: int) -> int:
    """An upper bound on the blocks one request of ``num_tokens`` tokens
    holds at any step when a step schedules at most ``max_chunk`` of its
    tokens: every block for full attention; for a window of ``w`` tokens at
    most ``cdiv(max_chunk + w - 2, block_size) + 1`` (before a chunk of
    ``n`` tokens after ``c`` computed, the blocks wholly before token ``c -
    w + 1`` are freed, so it holds blocks ``(c - w + 1) // bs`` to
    ``cdiv(c + n, bs) - 1``: the most when ``c - w + 1`` ends a block), never
    more than the tokens' blocks.  A request whose bound exceeds the pool is
    refused at arrival: below it, a request alone always fits."""
    total = 0
    for s in specs:
        blocks = cdiv(num_tokens, s.block_size)
        if s.sliding_window is not None:
            n = min(max_chunk, num_tokens)
            blocks = min(blocks, cdiv(n + s.sliding_window - 2, s.block_size) + 1)
        total += blocks
    return total


class _EvictionLog(KVCacheMetricsCollector):
    """The pool's collector hook, used only to log evicted hashes."""

    def __init__(self, log: list[bytes], memo: dict[str, Any]) -> None:
        super().__init__(1.0)
        self.log = log
        self.memo = memo  # logged only while some lookup is memoised

    def on_block_allocated(self, block: KVCacheBlock) -> None:
        pass

    def on_block_accessed(self, block: KVCacheBlock) -> None:
        pass

    def on_block_evicted(self, block: KVCacheBlock) -> None:
        key = block._block_hash
        if key is not None and self.memo:
            self.log.append(key[:-4])  # the block hash without its group suffix


class GroupSlots:
    """Block tables per group of the requests that hold blocks, on one pool."""

    counts_misses = True

    def __init__(
        self,
        pool: BlockPool,
        specs: Sequence[GroupSpec],
        max_model_len: int,
        tally: MissTally | None = None,
    ) -> None:
        self.pool = pool
        self.specs = tuple(specs)
        self.coordinator = KVCacheCoordinator(pool, specs, max_model_len, pool.hash_block_size)
        self.hash_block_size = self.coordinator.hash_block_size
        self.stats = LookupStats()
        self.stored = 0  # blocks made reachable by hash, all groups
        self.ever: set[BlockHash] = set()  # hashes cached in some group so far
        self.tally = MissTally() if tally is None else tally
        self.caching = pool.enable_caching
        self._all_groups = list(range(len(self.specs)))
        # lookups to reuse: rid -> (change log position, max length, hit, tokens, hashes)
        self._memo: dict[str, tuple[int, int, Any, int, set[bytes]]] = {}
        self._changed: list[bytes] = []  # hashes cached or evicted (any group)
        self._log_base = 0
        uniform = all(sp.block_size == self.hash_block_size for sp in self.specs)
        self._memoise = uniform and self.caching and pool.metrics_collector is None
        if self._memoise:
            pool.metrics_collector = _EvictionLog(self._changed, self._memo)

    def lookup(self, req: SlotRequest) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Per group the blocks of ``req``'s longest hit, and its tokens."""
        if not self.caching:
            return (), 0
        limit = req.num_tokens - 1
        memo = self._memo.get(req.rid) if self._memoise else None
        if memo is not None and memo[1] == limit:
            pos, _, hit, tokens, keys = memo
            log = self._changed
            for j in range(pos - self._log_base, len(log)):
                if log[j] in keys:
                    break
            else:
                self.stats.count(req, tokens)
                return tuple(list(b) for b in hit), tokens
        hit, tokens = self.coordinator.find_longest_cache_hit(req.block_hashes, limit)
        if self._memoise:
            if memo is None or memo[1] != limit:
                keys = set(req.block_hashes[: limit // self.hash_block_size])
            self._memo[req.rid] = (self._log_base + len(self._changed), limit, hit, tokens, keys)
            hit = tuple(list(b) for b in hit)
        self.stats.count(req, tokens)
        return hit, tokens

    def allocate(
        self,
        req: SlotRequest,
        num_new: int,
        num_hit: int = 0,
        hit: Sequence[Any] = (),
        *,
        cache: bool = True,
    ) -> bool:
        """Slots for ``num_new`` more tokens after ``num_computed + num_hit``."""
        got = self.coordinator.allocate_slots(
            req.hashable,
            num_new,
            num_hit,
            tuple(hit) if hit else None,
            num_computed_tokens=req.num_computed,
            num_tokens=req.num_tokens,
            cache=False,
        )
        if got is None:
            return False
        memo = self._memo
        if memo and memo.pop(req.rid, None) is not None and not memo:
            self._log_base += len(self._changed)
            self._changed.clear()
        if cache and self.caching:
            upto = min(req.num_computed + num_hit, self.coordinator.max_model_len) + num_new
            self.cache_blocks(req, min(upto, req.num_tokens))
        return True

    def cache_blocks(self, req: SlotRequest, num_tokens: int) -> None:
        """Make the request's full blocks up to ``num_tokens`` reachable by
        hash in every group."""
        rid = req.rid
        hbs = self.hash_block_size
        hashes = req.block_hashes
        request = req.hashable
        for g in self.coordinator.groups:
            table = g.tables.get(rid)
            if table is None:
                continue
            done = g.num_cached.get(rid, 0)
            bs = g.spec.block_size
            full = num_tokens // bs
            if done >= full:
                continue
            before = sum(1 for b in table[done:full] if not b.is_null)
            g.cache(request, num_tokens)
            self.stored += before
            added = hashes[done * bs // hbs : full * bs // hbs]
            self.ever.update(added)
            if self._memo:
                self._changed.extend(added)

    def misses(self, req: SlotRequest, num_hit: int) -> MissArgs:
        """The miss reasons of a request first scheduled with ``num_hit``
        cached tokens (blocks of the hash block size), before its own
        blocks are stored: the arguments of ``MissTally.add``."""
        return miss_args(req, num_hit, self.hash_block_size, self.ever, self._cached_everywhere)

    def _cached_everywhere(self, h: BlockHash) -> bool:
        if any(s.block_size != self.hash_block_size for s in self.specs):
            return False  # a hash block is not a block of every group
        return self.pool.get_cached_block(h, self._all_groups) is not None

    def add_misses(self, m: MissArgs) -> None:
        self.tally.add(*m)

    def free(self, req: SlotRequest) -> None:
        """Give the request's blocks back, every group's last block first."""
        self.coordinator.free(req.rid)

    def num_blocks(self, rid: str) -> int:
        """Blocks the request holds, all groups (null blocks not counted)."""
        return sum(
            1 for g in self.coordinator.groups for b in g.tables.get(rid, ()) if not b.is_null
        )


def parse_groups(text: str, block_size: int) -> list[GroupSpec]:
    """``"full,sliding:4096"`` (``--kv-cache-groups``' syntax) -> a
    full-attention and a 4096-token sliding-window group of ``block_size``
    tokens a block (ValueError naming the bad part)."""
    attention = parse_kv_cache_groups(text) or ((FULL_ATTENTION, None),)
    return [GroupSpec(kind, block_size, window) for kind, window in attention]
