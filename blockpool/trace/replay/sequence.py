"""Sequence mode on real pools: one pool per capacity, in step.

Requests in file order, one at a time, prompt blocks only (the Mooncake
paper's Fig. 9 setting): the longest cached prefix (never the block holding
the last prompt token), ``touch`` it, allocate the rest, cache the full
blocks, free them all in reverse.  A request needing more blocks than the
pool holds besides the null block is refused and changes nothing.

:class:`SequenceDriver` drives any object with vLLM 0.16's ``BlockPool``
methods (ours, or vLLM's own in ``bench/``); each request is hashed once for
all the pools.  A layout of other KV-cache groups (a sliding window, a
hybrid model) gets a :class:`~blockpool.trace.replay.sequence_groups.GroupSequenceDriver`
per capacity instead (``groups``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from blockpool.common.miss_reasons import first_unstored
from blockpool.core.admission import cdiv, hit_limit
from blockpool.core.attention import GroupSpec
from blockpool.core.block_hasher import get_request_block_hasher
from blockpool.core.free_order import APPEND_ALL, FREE_ORDERS, FreeOrder
from blockpool.core.hashing import BlockHash, HashFn
from blockpool.core.pool import BlockPool
from blockpool.trace.replay.results import CapacityResult, capacity_blocks
from blockpool.trace.replay.sequence_groups import (
    GroupRequest,
    GroupSequenceDriver,
    hash_block_size,
    is_plain,
    max_model_len,
    removed_blocks,
    unbounded_group_blocks,
)
from blockpool.trace.workload.keys import make_request
from blockpool.trace.workload.reader import Trace


def pool_accepts_free_order() -> bool:
    """Whether this BlockPool takes a ``free_order`` argument."""
    return "free_order" in inspect.signature(BlockPool).parameters


def make_pool(num_blocks: int, block_size: int, free_order: str = APPEND_ALL) -> BlockPool:
    """A caching pool with events on (they count the evictions)."""
    if free_order not in FREE_ORDERS:
        raise ValueError(f"unknown free order {free_order!r} (known: {', '.join(FREE_ORDERS)})")
    kwargs: dict[str, Any] = {}
    if free_order != APPEND_ALL:
        if not pool_accepts_free_order():
            raise ValueError(
                f"free order {free_order!r} needs a BlockPool with a free_order option; "
                "this one has only vLLM 0.16's append_all"
            )
        kwargs["free_order"] = free_order
    return BlockPool(num_blocks, True, block_size, True, **kwargs)


class SequenceDriver:
    """Sequence mode on one pool (any object with vLLM's BlockPool methods)."""

    def __init__(
        self, pool: Any, block_size: int, result: CapacityResult, reasons: bool = True
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.result = result
        self.usable = pool.num_gpu_blocks - 1
        self.stored: set[bytes] | None = set() if reasons else None
        self.gids = [0]

    def step(self, num_tokens: int, request: Any, hashes: Sequence[BlockHash]) -> int:
        """One request; returns its hit blocks (-1: refused)."""
        bs = self.block_size
        res = self.result
        res.prompt_tokens += num_tokens
        num_blocks = cdiv(num_tokens, bs)
        if num_blocks > self.usable:
            res.refused += 1
            res.refused_tokens += num_tokens
            return -1
        pool = self.pool
        num_full = num_tokens // bs
        max_hit = hit_limit(num_tokens, bs, num_full)
        get, gids = pool.get_cached_block, self.gids
        hits = []
        for i in range(max_hit):
            found = get(hashes[i], gids)
            if found is None:
                break
            hits.append(found[0])
        k = len(hits)
        if self.stored is not None:
            self._reasons(hashes, k, max_hit, num_full, num_blocks)
        pool.touch(hits)
        blocks = hits + pool.get_new_blocks(num_blocks - k)
        pool.cache_full_blocks(request, blocks, k, num_full, bs, 0)
        pool.free_blocks(blocks[::-1])
        events = pool.take_events()
        if events:
            res.evictions += removed_blocks(events)
        res.admitted += 1
        res.hit_tokens += k * bs
        return k

    def _reasons(
        self, hashes: Sequence[BlockHash], k: int, max_hit: int, num_full: int, num_blocks: int
    ) -> None:
        stored = self.stored
        assert stored is not None
        seen = first_unstored(hashes, k, num_full, stored)
        last_token = 0
        if max_hit < num_full and k == max_hit:
            last_token = 1 if self.pool.get_cached_block(hashes[max_hit], self.gids) else 0
        partial = 1 if num_blocks > num_full else 0
        self.result.misses.add(k, seen, num_full, last_token, partial)
        stored.update(hashes[seen:num_full])


def unbounded_blocks(trace: Trace, block_size: int) -> int:
    """A pool size that never evicts on this trace (every block of every request)."""
    return sum(-(-r.input_length // block_size) for r in trace.requests) + 1


class SequencePools:
    """One pool per capacity, replayed in step (each request hashed once).

    ``groups``: the pool's KV-cache groups; any layout but one full-attention
    group is replayed through a coordinator per pool (hashed at the smallest
    group block size, which ``block_size`` must then be)."""

    def __init__(
        self,
        trace: Trace,
        block_size: int,
        capacities_tokens: Sequence[int | None],
        hash_fn: HashFn,
        free_order: FreeOrder = APPEND_ALL,
        pool_factory: Callable[[int, int], Any] | None = None,
        groups: Sequence[GroupSpec] | None = None,
    ) -> None:
        self.trace = trace
        self.block_size = block_size
        self.hash_fn = hash_fn
        specs = None if is_plain(groups) else groups
        if specs is not None and hash_block_size(specs) != block_size:
            raise ValueError(
                f"block size {block_size} is not the smallest group block size "
                f"{hash_block_size(specs)}"
            )
        model_len = max_model_len(trace)
        self.drivers: list[SequenceDriver | GroupSequenceDriver] = []
        for cap in capacities_tokens:
            blocks = capacity_blocks(cap, block_size)
            if blocks is not None and blocks < 1:
                raise ValueError(f"{cap} tokens hold no block of {block_size} tokens")
            if blocks is not None:
                n = blocks
            elif specs is None:
                n = unbounded_blocks(trace, block_size)
            else:
                n = unbounded_group_blocks(trace, specs)
            pool = (
                pool_factory(n, block_size)
                if pool_factory is not None
                else make_pool(n, block_size, free_order)
            )
            res = CapacityResult(cap, blocks)
            if specs is None:
                self.drivers.append(SequenceDriver(pool, block_size, res))
            else:
                self.drivers.append(GroupSequenceDriver(pool, specs, res, model_len))

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[CapacityResult]:
        hasher = get_request_block_hasher(self.block_size, self.hash_fn)
        trace = self.trace
        total = len(trace.requests)
        for i, req in enumerate(trace.requests):
            r = make_request(trace, req, str(i), hasher)
            view = GroupRequest(r.request_id, r.all_token_ids, r.block_hashes, r.lora_request)
            for d in self.drivers:
                d.step(req.input_length, view, r.block_hashes)
            if progress is not None and (i & 15 == 15 or i + 1 == total):
                progress(i + 1, total)
        return [d.result for d in self.drivers]


def replay_pools(
    trace: Trace,
    block_size: int,
    capacities_tokens: Sequence[int | None],
    hash_fn: HashFn,
    free_order: FreeOrder = APPEND_ALL,
    progress: Callable[[int, int], None] | None = None,
    groups: Sequence[GroupSpec] | None = None,
) -> list[CapacityResult]:
    """Sequence mode with one real pool per capacity, all in one loop."""
    pools = SequencePools(trace, block_size, capacities_tokens, hash_fn, free_order, groups=groups)
    return pools.run(progress)
