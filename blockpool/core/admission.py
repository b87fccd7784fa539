"""The admission rules every pool model applies (vLLM 0.16.0's
``KVCacheManager.get_computed_blocks`` / ``allocate_slots``), which the
coordinator applies per attention type (for the request manager too), and
these functions share with the shadow pools and the trace replays (sequence
mode, the scheduler's slots, the one-pass curve):

* the hit walk looks at most at the full blocks before the one holding the
  prompt's last token (that token is always computed again), and stops at
  the first miss (``hit_limit``);
* a request then needs ``cdiv(tokens, block_size) - hits`` new blocks per
  group (``new_blocks``);
* it fits when those, plus the hit blocks that sit in the free queue (they
  leave it when touched), are no more than the free blocks (``fits``).

The walk itself stays with each model's storage (a pool's hash map, a
shadow's dict); these functions are the arithmetic they
share.  A model plugs in by calling them around its own lookup loop.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hit_limit(num_tokens: int, block_size: int, num_hashes: int) -> int:
    """How many leading blocks the hit walk may look at."""
    return min((num_tokens - 1) // block_size, num_hashes)


def new_blocks(num_tokens: int, block_size: int, num_hit: int) -> int:
    """Blocks a request of ``num_tokens`` with ``num_hit`` hit blocks
    allocates, per group."""
    return cdiv(num_tokens, block_size) - num_hit


def fits(num_new: int, num_groups: int, evictable_hits: int, num_free: int) -> bool:
    """Whether the admission can be done with ``num_free`` free blocks."""
    return num_new * num_groups + evictable_hits <= num_free
