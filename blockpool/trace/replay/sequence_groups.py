"""Sequence mode over KV-cache groups: sliding-window and hybrid models.

A model whose pool is one full-attention group is replayed by the one-pass
curve or :class:`~blockpool.trace.replay.sequence.SequenceDriver`.  Any other
layout -- several groups (full attention plus sliding windows, or two
full-attention groups) or a sliding window alone -- is replayed here with
vLLM 0.16.0's ``KVCacheManager`` logic over one real pool per capacity
(:class:`~blockpool.core.coordinator.KVCacheCoordinator`): requests in file
order, one at a time, the whole prompt:

* look up the hit: ``find_longest_cache_hit(block_hashes, num_tokens - 1)``
  (vLLM's ``get_computed_blocks``: the last prompt token is always
  computed), every group's walk and the hybrid fixed point;
* ``allocate_slots`` for the rest of the prompt with the hit blocks (a
  window's skipped blocks are null; hit blocks in the free queue count as
  needed).  ``None`` -- the pool, all of it free between requests, cannot
  hold the prompt with this hit -- is a refusal and changes nothing;
* cache the prompt's full blocks in every group, free every group's table.

**Hit tokens** are the hit length (vLLM's ``num_computed_tokens`` at the
first schedule, what ``prefix_cache_hits`` counts).

**Miss reasons** are not classified here: a window's hit need not be a
prefix of cached blocks (the blocks left of the window are never looked up),
so "cold" and "evicted" per prompt block have no meaning shared by every
group; a result counts hit and missed tokens only (``classified`` off).

**Evictions** are the blocks whose hash left the cache (``BlockRemoved``),
every group's.

**Capacity.**  A pool of ``num_gpu_blocks`` blocks serves every group; vLLM
logs its token capacity as ``num_blocks // len(groups) * min block size``
(``_report_kv_cache_config`` in ``vllm/v1/core/kv_cache_utils.py``):
:func:`vllm_token_capacity`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blockpool.core.admission import cdiv
from blockpool.core.attention import GroupSpec
from blockpool.core.coordinator import KVCacheCoordinator
from blockpool.core.hashing import BlockHash
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.sizing.capacity import vllm_kv_cache_tokens
from blockpool.trace.workload.reader import Trace

REASONS_NOTE = (
    "miss reasons are not classified for sliding-window groups (a window's hit is not a "
    "prefix of cached blocks): hit and missed tokens only"
)


def is_plain(specs: Sequence[GroupSpec] | None) -> bool:
    """One full-attention group (or none given): the fast paths apply."""
    return not specs or (len(specs) == 1 and specs[0].is_full)


def hash_block_size(specs: Sequence[GroupSpec]) -> int:
    """The block size the prompt is hashed at (the smallest group's)."""
    return min(s.block_size for s in specs)


def vllm_token_capacity(num_blocks: int, specs: Sequence[GroupSpec]) -> int:
    """vLLM's "GPU KV cache size: N tokens" for a pool of ``num_blocks``."""
    return vllm_kv_cache_tokens(num_blocks, len(specs), hash_block_size(specs))


def describe_groups(specs: Sequence[GroupSpec]) -> list[dict[str, Any]]:
    """The groups as JSON: kind, block size, window."""
    return [
        {"group": i, "kind": s.kind, "block_size": s.block_size, "sliding_window": s.sliding_window}
        for i, s in enumerate(specs)
    ]


def name_groups(specs: Sequence[GroupSpec]) -> str:
    """``"full_attention, sliding_window 4096"`` (one name per group)."""
    return ", ".join(
        s.kind if s.sliding_window is None else f"{s.kind} {s.sliding_window}" for s in specs
    )


def prompt_blocks(num_tokens: int, specs: Sequence[GroupSpec]) -> int:
    """Blocks a prompt takes in every group together with no hit."""
    return sum(cdiv(num_tokens, s.block_size) for s in specs)


def unbounded_group_blocks(trace: Trace, specs: Sequence[GroupSpec]) -> int:
    """A pool that never evicts on this trace: every block of every request
    in every group, and the null block."""
    return sum(prompt_blocks(r.input_length, specs) for r in trace.requests) + 1


def max_model_len(trace: Trace) -> int:
    """A ``max_model_len`` that clamps no prompt of ``trace``."""
    return max((r.input_length for r in trace.requests), default=1)


class GroupRequest:
    """What the coordinator and ``cache_full_blocks`` read of a request."""

    __slots__ = ("all_token_ids", "block_hashes", "lora_request", "request_id")

    def __init__(self, rid: str, tokens: list[int], hashes: list[BlockHash], lora: Any) -> None:
        self.request_id = rid
        self.all_token_ids = tokens
        self.block_hashes = hashes
        self.lora_request = lora


def removed_blocks(events: list[Any]) -> int:
    """Blocks whose hash left the cache (``BlockRemoved`` events)."""
    return sum(len(e.block_hashes) for e in events if e.__class__.__name__ == "BlockRemoved")


class GroupSequenceDriver:
    """Sequence mode on one pool shared by ``specs``' groups."""

    def __init__(
        self, pool: Any, specs: Sequence[GroupSpec], result: CapacityResult, model_len: int
    ) -> None:
        self.pool = pool
        self.specs = tuple(specs)
        self.result = result
        result.classified = False
        self.coordinator = KVCacheCoordinator(pool, specs, model_len, hash_block_size(specs))
        self.hits: list[int] | None = None  # a list: each request's hit tokens (-1: refused)

    def step(self, num_tokens: int, request: Any, hashes: list[BlockHash]) -> int:
        """One request; returns its hit tokens (-1: refused, nothing changed)."""
        res = self.result
        res.prompt_tokens += num_tokens
        co = self.coordinator
        hit, num_hit = co.find_longest_cache_hit(hashes, num_tokens - 1)
        new = co.allocate_slots(
            request,
            num_tokens - num_hit,
            num_hit,
            hit,
            num_computed_tokens=0,
            num_tokens=num_tokens,
        )
        if new is None:
            res.refused += 1
            res.refused_tokens += num_tokens
            num_hit = -1
        else:
            co.free(request.request_id)
            events = self.pool.take_events()
            if events:
                res.evictions += removed_blocks(events)
            res.admitted += 1
            res.hit_tokens += num_hit
        if self.hits is not None:
            self.hits.append(num_hit)
        return num_hit
