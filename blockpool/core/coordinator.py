"""A request's blocks in every KV-cache group of one pool (vLLM 0.16.0's
``KVCacheCoordinator`` and ``KVCacheManager.allocate_slots``, for full
attention and sliding-window groups).

Every group holds its own block table per request, all drawn from one
:class:`BlockPool`; a block hash is cached per group (the pool keys it by
hash and group id).

* **Hit** (``find_longest_cache_hit``): one group → that group's walk.  Several
  attention types → vLLM's fixed point: full attention first (its walk from
  the left bounds the rest), then each other type within the current length;
  when one shortens it, every type is asked again, until none does (one round
  when the model is one full-attention type plus one other).  Hit lengths are
  multiples of the least common multiple of the block sizes.
* **Allocate** (``allocate_slots``): first free the blocks that fell out of a
  window (``remove_skipped_blocks``), then count what is needed per group --
  new blocks for the tokens past the computed ones (those skipped by a window
  need none) plus hit blocks that sit in the free queue -- refuse when the
  pool has fewer free, else touch the hits (skipped ones become null
  blocks), take the new blocks and cache the full ones.
* **Free**: each group's table in reverse, the null blocks left out.

Group ``i`` of the coordinator is ``specs[i]``; the pool knows it by
``group_ids[i]`` (``i`` unless given), the id its hashes are cached under.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import lcm
from typing import Any

from blockpool.core.admission import cdiv
from blockpool.core.attention import GroupSpec
from blockpool.core.block import KVCacheBlock
from blockpool.core.hashing import BlockHash, BlockHashList, BlockHashListWithBlockSize
from blockpool.core.pool import BlockPool

Blocks = tuple[list[KVCacheBlock], ...]


class _GroupTables:
    """One group's block tables (vLLM's ``SingleTypeKVCacheManager``)."""

    __slots__ = ("gid", "num_cached", "pool", "spec", "tables", "window")

    def __init__(self, spec: GroupSpec, gid: int, pool: BlockPool) -> None:
        self.spec = spec
        self.window = spec.sliding_window
        self.gid = gid
        self.pool = pool
        self.tables: dict[str, list[KVCacheBlock]] = {}
        self.num_cached: dict[str, int] = {}

    def num_to_allocate(
        self, rid: str, num_tokens: int, hit: Sequence[KVCacheBlock], total_computed: int
    ) -> int:
        bs = self.spec.block_size
        required = -(-num_tokens // bs)  # cdiv, inline: once per group per decode step
        held = len(self.tables.get(rid, ()))
        if rid in self.num_cached:  # running: no new hits
            return required - held if required > held else 0
        skipped = self.spec.skipped_tokens(total_computed) // bs
        new = max(required - max(skipped, len(hit) + held), 0)
        skip_hits = max(0, skipped - held)
        evictable = sum(1 for b in hit[skip_hits:] if b.ref_cnt == 0 and not b.is_null)
        return new + evictable

    def add_hits(self, rid: str, hit: Sequence[KVCacheBlock], num_computed: int) -> None:
        if rid in self.num_cached:
            return
        table = self.tables.setdefault(rid, [])
        skipped = self.spec.skipped_tokens(num_computed) // self.spec.block_size
        kept = list(hit[skipped:]) if skipped > 0 else list(hit)
        self.pool.touch(kept)
        table.extend([self.pool.null_block] * skipped)
        table.extend(kept)
        self.num_cached[rid] = len(table)

    def add_new(self, rid: str, num_tokens: int) -> list[KVCacheBlock]:
        table = self.tables.setdefault(rid, [])
        n = cdiv(num_tokens, self.spec.block_size) - len(table)
        if n <= 0:
            return []
        blocks = self.pool.get_new_blocks(n)
        table.extend(blocks)
        return blocks

    def cache(self, request: Any, num_tokens: int) -> None:
        rid = request.request_id
        done = self.num_cached.get(rid, 0)
        full = num_tokens // self.spec.block_size
        if done >= full:
            return
        self.pool.cache_full_blocks(
            request, self.tables[rid], done, full, self.spec.block_size, self.gid
        )
        self.num_cached[rid] = full

    def remove_skipped(self, rid: str, total_computed: int) -> None:
        skipped_tokens = self.spec.skipped_tokens(total_computed)
        if skipped_tokens <= 0:
            return
        table = self.tables.get(rid)
        if not table:
            return
        removed: list[KVCacheBlock] = []
        for i in range(min(skipped_tokens // self.spec.block_size, len(table)) - 1, -1, -1):
            if table[i].is_null:
                break  # the ones before were nulled by an earlier call
            removed.append(table[i])
            table[i] = self.pool.null_block
        self.pool.free_blocks(removed)

    def free(self, rid: str) -> None:
        table = self.tables.pop(rid, [])
        self.pool.free_blocks(reversed(table))
        self.num_cached.pop(rid, None)


class KVCacheCoordinator:
    """The groups of one pool; ``specs[i]`` is group ``i``, cached in the
    pool under ``group_ids[i]`` (default ``i``)."""

    def __init__(
        self,
        pool: BlockPool,
        specs: Sequence[GroupSpec],
        max_model_len: int,
        hash_block_size: int | None = None,
        use_eagle: bool = False,
        *,
        group_ids: Sequence[int] | None = None,
    ) -> None:
        if not specs:
            raise ValueError("a coordinator needs at least one KV-cache group")
        gids = list(range(len(specs)) if group_ids is None else group_ids)
        if len(gids) != len(specs) or len(set(gids)) != len(gids):
            raise ValueError(f"group ids must be distinct, one per group, got {gids}")
        self.pool = pool
        self.specs = tuple(specs)
        self.max_model_len = max_model_len
        self.hash_block_size = hash_block_size or min(s.block_size for s in specs)
        if any(s.block_size % self.hash_block_size for s in specs):
            raise ValueError("every group's block size must be a multiple of the hash block size")
        self.use_eagle = use_eagle
        self.groups = tuple(_GroupTables(s, gid, pool) for s, gid in zip(specs, gids, strict=True))
        self._no_hits: tuple[tuple[KVCacheBlock, ...], ...] = tuple(() for _ in specs)
        # one entry per distinct spec: its group indexes and the pool's ids for
        # them; full attention first
        types: list[tuple[GroupSpec, list[int], list[int]]] = []
        for i, s in enumerate(specs):
            for spec, idx, ids in types:
                if spec == s:
                    idx.append(i)
                    ids.append(gids[i])
                    break
            else:
                types.append((s, [i], [gids[i]]))
        self.types = sorted(types, key=lambda t: not t[0].is_full)
        self.alignment = lcm(*(t[0].block_size for t in self.types))
        if use_eagle and any(
            not s.is_full and s.block_size != self.alignment for s, _, _ in self.types
        ):
            # vLLM 0.16.0 asserts this at the first such hit
            raise ValueError("eagle needs every sliding-window group at the largest block size")

    # ------------------------------------------------------------------ hits

    def _hashes(self, spec: GroupSpec, hashes: list[BlockHash]) -> BlockHashList:
        if spec.block_size == self.hash_block_size:
            return hashes
        return BlockHashListWithBlockSize(hashes, self.hash_block_size, spec.block_size)

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[Blocks, int]:
        """Per group the hit blocks (nulls where a window skips), and the hit
        length in tokens."""
        pool = self.pool
        if len(self.types) == 1:
            spec, _, ids = self.types[0]
            hit = spec.find_longest_cache_hit(
                self._hashes(spec, block_hashes), max_length, ids, pool, spec.block_size,
                self.use_eagle,
            )  # fmt: skip
            return hit, len(hit[0]) * spec.block_size
        per_group: list[list[KVCacheBlock] | None] = [None] * len(self.specs)
        length = max_length
        simple = len(self.types) == 2 and self.types[0][0].is_full
        while True:
            cur = length
            for spec, idx, ids in self.types:
                known = per_group[idx[0]]
                if spec.is_full and known is not None:
                    cur = cur // spec.block_size * spec.block_size
                    continue
                hit = spec.find_longest_cache_hit(
                    self._hashes(spec, block_hashes), cur, ids, pool, self.alignment,
                    self.use_eagle,
                )  # fmt: skip
                cur = len(hit[0]) * spec.block_size
                for i, blocks in zip(idx, hit, strict=True):
                    per_group[i] = blocks
            if cur >= length:
                break
            length = cur
            if simple:
                break
        spec, idx, _ = self.types[0]
        if spec.is_full:
            keep = length // spec.block_size
            for i in idx:
                kept = per_group[i]
                if kept is not None:
                    del kept[keep:]
        return tuple(b if b is not None else [] for b in per_group), length

    # ------------------------------------------------------------------ slots

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Blocks | None = None,
        num_computed_tokens: int | None = None,
        num_tokens: int | None = None,
        cache: bool = True,
    ) -> Blocks | None:
        """vLLM's ``allocate_slots`` without lookahead or connectors: the new
        blocks per group, or None (nothing allocated) when too few are free.
        ValueError, before anything changes, for no new tokens, hit lists
        that are not one per group, or hits for a request holding blocks.

        ``request`` needs ``request_id`` (and what ``cache_full_blocks``
        reads); ``num_computed_tokens`` / ``num_tokens`` default to its
        ``num_computed_tokens`` / ``num_tokens``."""
        rid = request.request_id
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be greater than 0, got {num_new_tokens}")
        if new_computed_blocks is not None:
            self._check_hits(rid, new_computed_blocks)
        computed = (
            request.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        )
        known = request.num_tokens if num_tokens is None else num_tokens
        if new_computed_blocks is not None and not any(new_computed_blocks):
            new_computed_blocks = None  # vLLM's empty KVCacheBlocks
        hits: Sequence[Sequence[KVCacheBlock]] = new_computed_blocks or self._no_hits
        local = computed + num_new_computed_tokens
        total = min(local, self.max_model_len)
        need_slot = min(total + num_new_tokens, self.max_model_len)
        groups = self.groups
        for g in groups:
            if g.window is not None:
                g.remove_skipped(rid, total)
        if self.get_num_blocks_to_allocate(rid, need_slot, hits, local) > (
            self.pool.get_num_free_blocks()
        ):
            return None
        if new_computed_blocks is not None:
            for g, hit in zip(groups, hits, strict=True):
                g.add_hits(rid, hit, local)
        new = tuple([g.add_new(rid, need_slot) for g in groups])
        if cache:
            self.cache_blocks(request, min(total + num_new_tokens, known))
        return new

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None = None,
        total_computed_tokens: int = 0,
    ) -> int:
        """The blocks that leave the free queue, all groups together, when the
        request grows to slots for ``num_tokens`` tokens with these hits: the
        new ones, plus the hits sitting in the queue.  Changes nothing."""
        hits = new_computed_blocks or self._no_hits
        if len(self.groups) == 1:  # the common case, without the loop
            return self.groups[0].num_to_allocate(
                request_id, num_tokens, hits[0], total_computed_tokens
            )
        needed = 0
        for g, hit in zip(self.groups, hits, strict=True):
            needed += g.num_to_allocate(request_id, num_tokens, hit, total_computed_tokens)
        return needed

    def _check_hits(self, rid: str, hits: Blocks) -> None:
        """Hits come one list per group, and only to a request holding no
        blocks yet (vLLM asserts both)."""
        if len(hits) != len(self.groups):
            raise ValueError(f"{len(hits)} lists of hit blocks for {len(self.groups)} groups")
        for i, g in enumerate(self.groups):
            if hits[i] and (rid in g.num_cached or g.tables.get(rid)):
                raise ValueError(f"request {rid} already holds blocks: it takes no new hits")

    def cache_blocks(self, request: Any, num_tokens: int) -> None:
        for g in self.groups:
            g.cache(request, num_tokens)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        for g in self.groups:
            g.remove_skipped(request_id, total_computed_tokens)

    def free(self, request_id: str) -> None:
        for g in self.groups:
            g.free(request_id)

    def tables_of(self, request_id: str) -> list[list[KVCacheBlock]]:
        """The request's block tables themselves (not copies), one per group."""
        return [g.tables[request_id] for g in self.groups]

    def adopt(self, request_id: str, tables: Sequence[list[KVCacheBlock]], num_cached: int) -> None:
        """Take ``tables`` (one per group, kept by reference) as the request's,
        their first ``num_cached`` blocks cached; the ref counts they imply are
        the caller's to have set (a restore writes the whole pool)."""
        if len(tables) != len(self.groups):
            raise ValueError(f"{len(tables)} block tables for {len(self.groups)} groups")
        for g, table in zip(self.groups, tables, strict=True):
            g.tables[request_id] = table
            g.num_cached[request_id] = num_cached

    def forget_all(self) -> None:
        """Drop every request's tables without freeing a block (the pool is
        being restored to another state)."""
        for g in self.groups:
            g.tables.clear()
            g.num_cached.clear()

    def get_blocks(self, request_id: str) -> Blocks:
        return tuple(list(g.tables.get(request_id, ())) for g in self.groups)

    def block_ids(self, request_id: str) -> list[list[int]]:
        return [[b.block_id for b in g.tables.get(request_id, ())] for g in self.groups]
