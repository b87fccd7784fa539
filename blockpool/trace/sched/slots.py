"""KV slots per request, allocated chunk by chunk, as vLLM 0.16's
``KVCacheManager`` allocates them for one full-attention group.

``lookup`` is ``get_computed_blocks``: the cached prefix of a waiting
request (never the block holding its last token), counted in the
lookup-level statistics vLLM exports as ``vllm:prefix_cache_queries`` and
``vllm:prefix_cache_hits`` -- every lookup, a retry of a request that could
not be admitted included; lookups of a preempted request go to
``preempted_queries``/``preempted_hits`` (vLLM's ``PrefixCacheStats``).

``allocate`` is ``allocate_slots`` without lookahead, connectors or
sliding windows: the blocks needed to hold ``num_computed + hit + new``
tokens (capped at ``max_model_len``), where a hit block that sits in the free
queue counts as one more block to take; ``False``, changing nothing, when the
pool lacks them.  Full blocks are cached up to the tokens scheduled so far
(at most the request's known tokens) unless ``cache=False`` (asynchronous
scheduling caches decode blocks when their token arrives: ``cache_blocks``).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any, Protocol

from blockpool.common.miss_reasons import MissTally, first_unstored
from blockpool.core.admission import cdiv, hit_limit
from blockpool.core.block import KVCacheBlock
from blockpool.core.hashing import BlockHash, group_id_suffix
from blockpool.core.pool import BlockPool

_GID0 = group_id_suffix(0)
# MissTally.add's arguments: (hit, seen, full, last_token, partial) blocks
MissArgs = tuple[int, int, int, int, int]


class SlotRequest(Protocol):
    """What the slot manager reads of a request."""

    rid: str
    num_computed: int
    num_preemptions: int

    @property
    def num_tokens(self) -> int: ...

    @property
    def block_hashes(self) -> list[BlockHash]: ...

    @property
    def hashable(self) -> object:
        """The object ``BlockPool.cache_full_blocks`` reads hashes from."""


class SlotBackend(Protocol):
    """What the scheduler asks of the KV cache (``KVSlots`` on a BlockPool;
    ``GroupSlots`` on its KV-cache groups; ``RuntimeSlots`` on a
    PoolRuntime's operations).  ``counts_misses``:
    whether ``misses``/``add_misses`` classify first admissions (the
    service's analysis does that for the runtime's)."""

    stats: LookupStats
    counts_misses: bool

    def lookup(self, req: SlotRequest) -> tuple[Sequence[Any], int]:
        """The hit (what ``allocate`` takes back: blocks, or a list of
        blocks per KV-cache group) and its tokens."""

    def allocate(
        self,
        req: SlotRequest,
        num_new: int,
        num_hit: int = 0,
        hit: Sequence[Any] = (),
        *,
        cache: bool = True,
    ) -> bool: ...

    def cache_blocks(self, req: SlotRequest, num_tokens: int) -> None: ...

    def free(self, req: SlotRequest) -> None: ...

    def misses(self, req: SlotRequest, num_hit: int) -> MissArgs: ...

    def add_misses(self, m: MissArgs) -> None: ...


def miss_args(
    req: SlotRequest,
    num_hit: int,
    block_size: int,
    ever: Container[BlockHash],
    cached: Callable[[BlockHash], bool],
) -> MissArgs:
    """``MissTally.add``'s arguments for a prompt first scheduled with
    ``num_hit`` cached tokens: ``ever`` holds the hashes stored so far;
    ``cached(h)``: whether the block after a hit at its limit (the one
    holding the last token) is cached now."""
    hashes = req.block_hashes
    n = req.num_tokens
    k = num_hit // block_size
    num_full = min(n // block_size, len(hashes))
    max_hit = hit_limit(n, block_size, num_full)
    seen = first_unstored(hashes, k, num_full, ever)
    last = 1 if max_hit < num_full and k == max_hit and cached(hashes[max_hit]) else 0
    return k, max(seen, k + last), num_full, last, 1 if n % block_size else 0


class LookupStats:
    """vLLM's ``PrefixCacheStats`` totals: tokens queried and hit per lookup."""

    __slots__ = (
        "hits",
        "preempted_hits",
        "preempted_queries",
        "preempted_requests",
        "queries",
        "requests",
    )

    def __init__(self) -> None:
        self.requests = self.queries = self.hits = 0
        self.preempted_requests = self.preempted_queries = self.preempted_hits = 0

    def count(self, req: SlotRequest, hit_tokens: int) -> None:
        """One lookup of ``req``'s tokens that found ``hit_tokens``."""
        if req.num_preemptions:
            self.preempted_requests += 1
            self.preempted_queries += req.num_tokens
            self.preempted_hits += hit_tokens
        else:
            self.requests += 1
            self.queries += req.num_tokens
            self.hits += hit_tokens

    def to_json(self) -> dict[str, int | float]:
        return {
            "prefix_cache_queries": self.queries,
            "prefix_cache_hits": self.hits,
            "prefix_cache_hit_rate": self.hits / self.queries if self.queries else 0.0,
            "prefix_cache_lookups": self.requests,
            "preempted_prefix_cache_lookups": self.preempted_requests,
            "preempted_prefix_cache_queries": self.preempted_queries,
            "preempted_prefix_cache_hits": self.preempted_hits,
        }


class KVSlots:
    """Block tables of the requests that hold blocks, on one ``BlockPool``."""

    counts_misses = True

    def __init__(
        self, pool: BlockPool, block_size: int, max_model_len: int, tally: MissTally | None = None
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.tables: dict[str, list[KVCacheBlock]] = {}
        self.num_cached: dict[str, int] = {}
        self.stats = LookupStats()
        self.stored = 0  # blocks made reachable by hash (evictions: stored - cached at the end)
        self.ever: set[BlockHash] = set()  # every hash stored so far (the miss reasons)
        self.tally = MissTally() if tally is None else tally
        self.caching = pool.enable_caching
        # lookups to resume: rid -> (eviction log position, blocks limit, hit, keys)
        self._memo: dict[str, tuple[int, int, list[KVCacheBlock], set[bytes]]] = {}
        self._evicted: list[bytes] = []  # keys evicted while a lookup is memoised
        self._log_base = 0

    def lookup(self, req: SlotRequest) -> tuple[list[KVCacheBlock], int]:
        """The cached blocks of ``req``'s longest hit prefix and their tokens."""
        if not self.caching:
            return [], 0
        bs = self.block_size
        hashes = req.block_hashes
        n = hit_limit(req.num_tokens, bs, len(hashes))
        # BlockPool.get_cached_block for group 0, inlined: the hot loop of
        # a blocked head request's retries.  Those start from the prefix
        # found last time when none of its keys was evicted since (the map
        # loses keys only by eviction; the first block of a key's entry
        # changes only when that block is evicted).
        get = self.pool.cached_block_hash_to_block._cache.get
        gid0 = _GID0
        start = 0
        memo = self._memo.get(req.rid)
        if memo is not None and memo[1] == n:
            pos, _, hit, keys = memo
            log = self._evicted
            for j in range(pos - self._log_base, len(log)):
                if log[j] in keys:
                    break
            else:
                start = len(hit)
        if start == 0:
            hit = []
            keys = set()
        put = hit.append
        add = keys.add
        for i in range(start, n):
            key = hashes[i] + gid0
            entry = get(key)
            if entry is None:
                break
            if entry.__class__ is dict:
                entry = next(iter(entry.values()))
            put(entry)
            add(key)
        self._memo[req.rid] = (self._log_base + len(self._evicted), n, hit, keys)
        hit = list(hit)
        tokens = len(hit) * bs
        self.stats.count(req, tokens)
        return hit, tokens

    def allocate(
        self,
        req: SlotRequest,
        num_new: int,
        num_hit: int = 0,
        hit: Sequence[KVCacheBlock] = (),
        *,
        cache: bool = True,
    ) -> bool:
        """Slots for ``num_new`` more tokens after ``num_computed + num_hit``."""
        bs = self.block_size
        rid = req.rid
        table = self.tables.get(rid)
        if table is not None and not hit:  # a running request: the common case
            computed = req.num_computed
            upto = computed + num_new
            if upto > self.max_model_len:
                upto = self.max_model_len
            grow = cdiv(upto, bs) - len(table)
            if grow > 0:
                pool = self.pool
                if grow > pool.free_block_queue.num_free_blocks:
                    return False
                if self._memo:
                    self._log_evictions(grow)
                table.extend(pool.get_new_blocks(grow))
            if cache and self.caching:
                upto = computed + num_new  # not capped: vLLM caches min(this, num_tokens)
                n = req.num_tokens
                if (upto if upto < n else n) // bs > self.num_cached.get(rid, 0):
                    self.cache_blocks(req, upto if upto < n else n)
            return True
        computed = min(req.num_computed + num_hit, self.max_model_len)
        need = min(computed + num_new, self.max_model_len)
        rid = req.rid
        table = self.tables.get(rid)
        have = 0 if table is None else len(table)
        required = cdiv(need, bs)
        take = required - have - len(hit)
        if take < 0:
            take = 0
        if hit:
            for b in hit:
                if not b.ref_cnt and not b.is_null:
                    take += 1
        pool = self.pool
        if take > pool.free_block_queue.num_free_blocks:
            return False
        if table is None:
            table = self.tables[rid] = []
            memo = self._memo
            if memo:
                memo.pop(rid, None)
                if not memo:
                    self._log_base += len(self._evicted)
                    self._evicted.clear()
        if hit:
            pool.touch(hit)
            table.extend(hit)
            self.num_cached[rid] = len(table)
        grow = required - len(table)
        if grow > 0:
            if self._memo:
                self._log_evictions(grow)
            table.extend(pool.get_new_blocks(grow))
        if cache and self.caching:
            upto = computed + num_new
            n = req.num_tokens
            self.cache_blocks(req, upto if upto < n else n)
        return True

    def _log_evictions(self, n: int) -> None:
        """Log the keys the next ``get_new_blocks(n)`` evicts (the queue's head)."""
        log = self._evicted
        b = self.pool.free_block_queue.fake_free_list_head.next_free_block
        for _ in range(n):
            assert b is not None
            key = b._block_hash
            if key is not None:
                log.append(key)
            b = b.next_free_block

    def cache_blocks(self, req: SlotRequest, num_tokens: int) -> None:
        """Make the request's full blocks up to ``num_tokens`` reachable by hash."""
        rid = req.rid
        done = self.num_cached.get(rid, 0)
        full = num_tokens // self.block_size
        if done >= full:
            return
        self.pool.cache_full_blocks(req.hashable, self.tables[rid], done, full, self.block_size, 0)
        self.stored += full - done
        self.ever.update(req.block_hashes[done:full])
        self.num_cached[rid] = full

    def misses(self, req: SlotRequest, num_hit: int) -> MissArgs:
        """The miss reasons of a request about to be first scheduled with
        ``num_hit`` cached tokens, before its own blocks are stored: the
        arguments of ``MissTally.add``, which ``add_misses`` calls."""
        cache = self.pool.cached_block_hash_to_block._cache
        return miss_args(req, num_hit, self.block_size, self.ever, lambda h: h + _GID0 in cache)

    def add_misses(self, m: MissArgs) -> None:
        self.tally.add(*m)

    def free(self, req: SlotRequest) -> None:
        """Give the request's blocks back, last block first."""
        table = self.tables.pop(req.rid, None)
        self.num_cached.pop(req.rid, None)
        if table:
            self.pool.free_blocks(reversed(table))

    def num_blocks(self, rid: str) -> int:
        table = self.tables.get(rid)
        return 0 if table is None else len(table)
