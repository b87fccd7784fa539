"""BlockPool: allocation, freeing and prefix caching of KV-cache blocks.

Behaviour is vLLM 0.16.0's (see docs/spec.md §5): the block ids returned, the free
queue's order, the hash map's contents, the events and the metrics samples are
the same call for call.  The hot paths inline the queue, map and collector
operations (the classes they stand for stay usable on their own); a
subclassed or foreign metrics collector is called through its methods.

``strict=True`` (ours, off by default) adds the checks vLLM skips and raises
a typed error before anything changes.  ``free_order="uncached_first"``
(ours, off by default) frees as vLLM >= 0.24 does (``free_order.py``).

Complexity: get_new_blocks O(n), free_blocks O(n), touch O(n),
cache_full_blocks O(new blocks + tokens in them), get_cached_block O(groups),
evict_blocks O(ids), reset_prefix_cache O(N), everything else O(1).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from blockpool.core.block import KVCacheBlock
from blockpool.core.errors import (
    DoubleFreeError,
    NullBlockError,
    PoolAssertionError,
    UnknownBlockError,
)
from blockpool.core.events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from blockpool.core.free_order import APPEND_ALL, FreeOrder, check_free_order, free_uncached_first
from blockpool.core.free_queue import FreeKVCacheBlockQueue
from blockpool.core.hash_map import BlockHashToBlockMap
from blockpool.core.hashing import (
    BlockHash,
    BlockHashList,
    BlockHashListWithBlockSize,
    ExternalBlockHash,
    group_id_suffix,
    int_block_hashes,
)
from blockpool.core.metrics import BlockMetricsState, KVCacheMetricsCollector

logger = logging.getLogger("blockpool")

_GID0 = group_id_suffix(0)


def _external(h: bytes) -> ExternalBlockHash:
    return int.from_bytes(h[-8:], "big") if int_block_hashes() else h


class BlockPool:
    """The pool of ``num_gpu_blocks`` KV-cache blocks (block 0 is the null block)."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: KVCacheMetricsCollector | None = None,
        *,
        strict: bool = False,
        free_order: FreeOrder | str = APPEND_ALL,
    ) -> None:
        if (
            not isinstance(num_gpu_blocks, int)
            or isinstance(num_gpu_blocks, bool)
            or num_gpu_blocks <= 0
        ):
            raise PoolAssertionError(
                f"num_gpu_blocks must be a positive int, got {num_gpu_blocks!r}"
            )
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        self.metrics_collector = metrics_collector
        self.strict = strict
        self.free_order = check_free_order(free_order)
        self._head_uncached = self.free_order != APPEND_ALL

    # ------------------------------------------------------------------ lookup

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: list[int]
    ) -> list[KVCacheBlock] | None:
        """One cached block per group for ``block_hash``, or None if any group
        misses.  Changes nothing."""
        cache = self.cached_block_hash_to_block._cache
        ret: list[KVCacheBlock] = []
        for gid in kv_cache_group_ids:
            entry = cache.get(block_hash + (_GID0 if gid == 0 else group_id_suffix(gid)))
            if entry is None:
                return None
            if entry.__class__ is dict:
                entry = next(iter(entry.values()))
            ret.append(entry)
        return ret

    # ------------------------------------------------------------------ caching

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """Make ``blocks[num_cached_blocks:num_full_blocks]`` reachable by hash,
        with hashes from ``request.block_hashes``; one BlockStored per call."""
        if num_cached_blocks >= num_full_blocks:
            return
        fine: list[BlockHash] = request.block_hashes
        if len(fine) < num_full_blocks:
            raise PoolAssertionError(
                f"request has {len(fine)} block hashes, {num_full_blocks} full blocks to cache"
            )
        block_hashes: BlockHashList
        if block_size == self.hash_block_size:
            block_hashes = fine
        else:
            block_hashes = BlockHashListWithBlockSize(fine, self.hash_block_size, block_size)
        new_blocks = blocks[num_cached_blocks:num_full_blocks]
        new_block_hashes = block_hashes[num_cached_blocks : num_cached_blocks + len(new_blocks)]
        if len(new_block_hashes) < len(new_blocks):
            raise IndexError("list index out of range")
        if self.strict:
            self._check_cacheable(new_blocks)
        suffix = _GID0 if kv_cache_group_id == 0 else group_id_suffix(kv_cache_group_id)
        cache = self.cached_block_hash_to_block._cache
        events = self.enable_kv_cache_events
        new_hashes: list[ExternalBlockHash] = []
        as_int = int_block_hashes()
        for blk, h in zip(new_blocks, new_block_hashes, strict=False):
            if blk.is_null:
                continue
            if blk._block_hash is not None:
                raise PoolAssertionError("The block already has a hash. This should not happen.")
            key = h + suffix
            blk._block_hash = key  # type: ignore[assignment]
            entry = cache.get(key)
            if entry is None:
                cache[key] = blk
            elif entry.__class__ is dict:
                entry[blk.block_id] = blk
            else:
                cache[key] = {entry.block_id: entry, blk.block_id: blk}
            if events:
                new_hashes.append(int.from_bytes(h[-8:], "big") if as_int else h)
        if events:
            parent = (
                None if num_cached_blocks == 0 else _external(block_hashes[num_cached_blocks - 1])
            )
            lora = request.lora_request
            self.kv_event_queue.append(
                BlockStored(
                    new_hashes,
                    parent,
                    request.all_token_ids[
                        num_cached_blocks * block_size : num_full_blocks * block_size
                    ],
                    block_size,
                    lora.adapter_id if lora else None,
                    MEDIUM_GPU,
                    lora.name if lora else None,
                )
            )

    # --------------------------------------------------------------- allocation

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` blocks from the queue's head, evicting their cached
        hashes (caching on) and giving each ref count 1.  Never looks up the
        cache.  ValueError, changing nothing, when too few are free."""
        queue = self.free_block_queue
        if num_blocks > queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        if num_blocks <= 0:
            if num_blocks == 0:
                return []
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        mc = self.metrics_collector
        fast_mc = mc.__class__ is KVCacheMetricsCollector
        if fast_mc:
            assert mc is not None
            block_metrics = mc.block_metrics
            rnd = mc.rng if mc.rng is not None else mc.random_fn()
            rate = mc.sample_rate
            clock = mc.clock
        caching = self.enable_caching
        if caching:
            cache = self.cached_block_hash_to_block._cache
            events = self.kv_event_queue if self.enable_kv_cache_events else None
            as_int = int_block_hashes()
        head = queue.fake_free_list_head
        curr = head.next_free_block
        ret: list[KVCacheBlock] = []
        append = ret.append
        queue.num_free_blocks -= num_blocks
        try:
            for _ in range(num_blocks):
                block = curr
                assert block is not None
                curr = block.next_free_block
                block.prev_free_block = block.next_free_block = None
                append(block)
                if caching:
                    # vLLM's _maybe_evict_cached_block, inlined.
                    if fast_mc:
                        if block.block_id in block_metrics:
                            mc._record_eviction(block_metrics.pop(block.block_id))  # type: ignore[union-attr]
                    elif mc is not None:
                        mc.on_block_evicted(block)
                    key = block._block_hash
                    if key is not None:
                        entry = cache.pop(key, None)
                        if entry is not None:
                            if entry is block:
                                gone = True
                            elif entry.__class__ is dict:
                                gone = entry.pop(block.block_id, None) is not None
                                if entry:
                                    cache[key] = entry
                            else:
                                gone = entry.block_id == block.block_id
                                if not gone:
                                    cache[key] = entry
                            if gone:
                                block._block_hash = None
                                if events is not None:
                                    h = int.from_bytes(key[-12:-4], "big") if as_int else key[:-4]
                                    events.append(BlockRemoved([h], MEDIUM_GPU))
                if block.ref_cnt != 0:
                    raise PoolAssertionError(
                        f"block {block.block_id} in the free queue has ref_cnt {block.ref_cnt}"
                    )
                block.ref_cnt = 1
                if fast_mc:
                    if rnd() < rate:
                        block_metrics[block.block_id] = BlockMetricsState(clock)
                elif mc is not None:
                    mc.on_block_allocated(block)
        finally:
            head.next_free_block = curr
            assert curr is not None
            curr.prev_free_block = head
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Tell the collector, then drop ``block``'s hash from the map if the map
        holds this block under it (BlockRemoved when events are on)."""
        mc = self.metrics_collector
        if mc is not None:
            mc.on_block_evicted(block)
        key = block._block_hash
        if key is None:
            return False
        if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            return False
        block._block_hash = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockRemoved([_external(key[:-4])], MEDIUM_GPU))
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take one more reference on each block; a free block leaves the queue."""
        if self.strict:
            self._check_own(blocks, "touch")
        mc = self.metrics_collector
        fast_mc = mc.__class__ is KVCacheMetricsCollector
        if fast_mc:
            assert mc is not None
            block_metrics = mc.block_metrics
        queue = self.free_block_queue
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                prev = block.prev_free_block
                nxt = block.next_free_block
                if prev is None or nxt is None:
                    raise RuntimeError(f"remove() called on an invalid block: {block}")
                prev.next_free_block = nxt
                nxt.prev_free_block = prev
                block.prev_free_block = block.next_free_block = None
                queue.num_free_blocks -= 1
            block.ref_cnt += 1
            if fast_mc:
                if block.block_id in block_metrics:
                    block_metrics[block.block_id].record_access()
            elif mc is not None:
                mc.on_block_accessed(block)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; those reaching 0 (null block
        aside) go to the queue's tail in the given order, first = evicted
        first.  A request frees its blocks in reverse.  (``uncached_first``:
        the hashless ones go to the head instead, see ``free_order.py``.)"""
        if self.strict:
            ordered_blocks = list(ordered_blocks)
            self._check_free(ordered_blocks)
        if self._head_uncached:
            free_uncached_first(self.free_block_queue, self.enable_caching, ordered_blocks)
            return
        queue = self.free_block_queue
        tail = queue.fake_free_list_tail
        last = tail.prev_free_block
        assert last is not None
        n = 0
        try:
            for block in ordered_blocks:
                rc = block.ref_cnt - 1
                block.ref_cnt = rc
                if rc == 0 and not block.is_null:
                    block.prev_free_block = last
                    last.next_free_block = block
                    last = block
                    n += 1
        finally:
            last.next_free_block = tail
            tail.prev_free_block = last
            queue.num_free_blocks += n

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cached hash of each block id.  A held block stays held and
        a free block stays where it is in the queue."""
        if self.strict:
            block_ids = list(block_ids)
            self._check_ids(block_ids)
        blocks = self.blocks
        n = len(blocks)
        for block_id in block_ids:
            if block_id >= n:
                raise PoolAssertionError(
                    f"Invalid block_id {block_id} >= {n}. This indicates a bug in "
                    f"the KV connector - workers should only report block IDs that "
                    f"were allocated by the scheduler."
                )
            self._maybe_evict_cached_block(blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash.  Refused (False, nothing changed) while any
        block but the null block is held."""
        num_used = self.num_gpu_blocks - self.free_block_queue.num_free_blocks
        if num_used != 1:
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet",
                num_used - 1,
            )
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block._block_hash = None
        if self.metrics_collector is not None:
            self.metrics_collector.reset()
        logger.info("Successfully reset prefix cache")
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    # -------------------------------------------------------------------- reads

    def get_num_free_blocks(self) -> int:
        """Free blocks, cached ones with ref count 0 included."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """``1 - free / (N - 1)``: the null block does not count."""
        total = self.num_gpu_blocks - 1
        if not total:
            return 0
        return 1.0 - (self.free_block_queue.num_free_blocks / total)

    def take_events(self) -> list[KVCacheEvent]:
        """Every event since the last call, in order ([] when events are off)."""
        if not self.enable_kv_cache_events:
            return []
        events = self.kv_event_queue
        self.kv_event_queue = []
        return events

    # ----------------------------------------------------------- strict checks

    def _check_own(self, blocks: Iterable[KVCacheBlock], op: str) -> None:
        pool_blocks = self.blocks
        n = len(pool_blocks)
        for block in blocks:
            bid = getattr(block, "block_id", None)
            if not isinstance(bid, int) or not 0 <= bid < n or pool_blocks[bid] is not block:
                raise UnknownBlockError(f"{op}: {block!r} is not a block of this pool")
            if block.is_null:
                raise NullBlockError(f"{op}: the null block (id 0) cannot be given to {op}")

    def _check_free(self, blocks: list[KVCacheBlock]) -> None:
        self._check_own(blocks, "free")
        counts = Counter(b.block_id for b in blocks)
        for bid, times in counts.items():
            held = self.blocks[bid].ref_cnt
            if times > held:
                raise DoubleFreeError(
                    f"free: block {bid} is held {held} time(s) but would be freed {times} time(s)"
                )

    def _check_cacheable(self, blocks: list[KVCacheBlock]) -> None:
        self._check_own([b for b in blocks if not b.is_null], "cache")
        for b in blocks:
            if not b.is_null and b._block_hash is not None:
                raise PoolAssertionError(
                    f"cache: block {b.block_id} already has a hash; it cannot be cached again"
                )

    def _check_ids(self, block_ids: list[Any]) -> None:
        n = len(self.blocks)
        for bid in block_ids:
            if not isinstance(bid, int) or isinstance(bid, bool) or not 0 <= bid < n:
                raise UnknownBlockError(f"block id {bid!r} is not in 0..{n - 1}")
