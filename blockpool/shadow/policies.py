"""Free-order policies for shadow pools: which free block is reused next.

A shadow pool (``blockpool.shadow.pool.ShadowPool``) keeps block slots
``1..capacity`` with ref counts and hashes, like BlockPool.  Its policy owns
the *free* slots (ref count 0) and decides the order in which they are reused
(and their cached hashes evicted).  Slot ids are ints; the policy reads
``keys[slot]`` (the slot's hash key or None) from the list the pool shares
with it.

Policies:

Their names are the free orders' (``blockpool.core.free_order``) plus ``"s3fifo"``;
``"vllm016"`` is an old spelling of ``"append_all"``, still accepted as input.

* ``AppendAll`` -- vLLM 0.16.0 (ours): every block reaching ref count 0 is
  appended to the tail in the order given; reuse pops the head.  Uncached
  (hashless) blocks sit between cached ones and push them out as they age.
* ``UncachedFirst`` -- later vLLM's ``free_blocks``: the blocks reaching 0 are
  split; those without a hash go to the FRONT of the queue (``prepend_n``,
  keeping their given order: the first listed becomes the new head), those
  with a hash to the tail (``append_n``).  Hashless blocks can never be a
  prefix hit, so spending them first keeps cached blocks longer.  (vLLM
  only splits when caching is on; shadows always cache.)
* ``S3FIFO`` -- S3-FIFO (Yang et al., SOSP '23) adapted to ref-counted blocks:
  the small, main and ghost FIFOs over the free blocks (``s3fifo.py``).

The base class is ``free_policy.py``; the free lists ``slot_lists.py``.

Complexity: ``release`` O(k), ``take`` O(1), ``victims`` O(n) (S3FIFO
amortised), ``order`` O(free).
"""

from __future__ import annotations

from typing import Final

from blockpool.core.free_order import APPEND_ALL, UNCACHED_FIRST
from blockpool.shadow.free_policy import FreePolicy
from blockpool.shadow.s3fifo import S3FIFO, S3FIFO_NAME
from blockpool.shadow.vllm_orders import AppendAll, UncachedFirst

POLICY_NAMES: Final[tuple[str, ...]] = (APPEND_ALL, UNCACHED_FIRST, S3FIFO_NAME)
# Old spellings accepted as input (settings, recordings): name -> its name now.
OLD_POLICY_NAMES: Final = {"vllm016": APPEND_ALL}


def policy_name(name: str) -> str:
    """The policy's name in ``POLICY_NAMES`` (an old spelling is mapped);
    ValueError naming the known ones otherwise."""
    name = OLD_POLICY_NAMES.get(name, name)
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown shadow policy {name!r} (one of {', '.join(POLICY_NAMES)})")
    return name


def make_policy(name: str) -> FreePolicy:
    """A fresh policy by name (``POLICY_NAMES``, or an old spelling)."""
    return _POLICIES[policy_name(name)]()


_POLICIES: dict[str, type[FreePolicy]] = {
    APPEND_ALL: AppendAll,
    UNCACHED_FIRST: UncachedFirst,
    S3FIFO_NAME: S3FIFO,
}
