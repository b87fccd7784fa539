"""Attention types of a KV-cache group and how each finds its cached prefix
(vLLM 0.16.0's ``FullAttentionManager`` and ``SlidingWindowManager`` in
``vllm/v1/core/single_type_kv_cache_manager.py``).

* **Full attention** needs every block of the prefix: the hit walks from the
  left and stops at the first block some group lacks.
* **Sliding window** (``window`` tokens, the new token included) needs only
  the blocks the next token still attends to: ``cdiv(window - 1,
  block_size)`` contiguous cached blocks.  The walk goes from the right and
  stops at the first such run; every block left of the run counts as
  computed but is the null block in the request's table (nothing is held
  for it).  Without such a run, the leading run of cached blocks is the hit
  (it may be shorter than the window).  Blocks that fall wholly out of the
  window as a request computes are freed (``skipped_tokens``).

A hit length is kept a multiple of ``alignment`` tokens (the least common
multiple of the groups' block sizes in a hybrid model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from blockpool.core.admission import cdiv
from blockpool.core.block import KVCacheBlock
from blockpool.core.hashing import BlockHashList
from blockpool.core.pool import BlockPool

AttentionKind = Literal["full_attention", "sliding_window"]
FULL_ATTENTION: AttentionKind = "full_attention"
SLIDING_WINDOW: AttentionKind = "sliding_window"


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group: its attention type, block size and window."""

    kind: AttentionKind = FULL_ATTENTION
    block_size: int = 16
    sliding_window: int | None = None  # tokens, for SLIDING_WINDOW

    def __post_init__(self) -> None:
        if self.kind not in (FULL_ATTENTION, SLIDING_WINDOW):
            raise ValueError(f"unknown attention kind {self.kind!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.kind == SLIDING_WINDOW:
            if self.sliding_window is None or self.sliding_window < 1:
                raise ValueError("a sliding-window group needs a positive sliding_window")
        elif self.sliding_window is not None:
            raise ValueError("a full-attention group has no sliding_window")

    @property
    def is_full(self) -> bool:
        return self.kind == FULL_ATTENTION

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the window of the next token (0 for full attention)."""
        if self.sliding_window is None:
            return 0
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def find_longest_cache_hit(
        self,
        block_hashes: BlockHashList,
        max_length: int,
        group_ids: list[int],
        pool: BlockPool,
        alignment: int,
        use_eagle: bool = False,
    ) -> tuple[list[KVCacheBlock], ...]:
        """The cached blocks of the longest hit no longer than ``max_length``
        tokens, one list per group of ``group_ids`` (all of this spec)."""
        bs = self.block_size

        def get(i: int) -> list[KVCacheBlock] | None:
            return pool.get_cached_block(block_hashes[i], group_ids)

        if self.sliding_window is None:
            hit = _from_left(get, min(max_length // bs, len(block_hashes)), len(group_ids))
            if use_eagle:
                _drop_last(hit)
            _align(hit, bs, alignment)
            return hit
        needed = cdiv(self.sliding_window - 1, bs) + (1 if use_eagle else 0)
        hit, found = _from_right(
            get, max_length // bs, len(group_ids), needed, pool.null_block, bs, alignment
        )
        if not found:
            _align(hit, bs, alignment)
        if use_eagle:
            _drop_last(hit)
        return hit


Lookup = Callable[[int], "list[KVCacheBlock] | None"]


def _from_left(get: Lookup, n: int, width: int) -> tuple[list[KVCacheBlock], ...]:
    """The run of cached blocks from block 0 (at most ``n``)."""
    hit: tuple[list[KVCacheBlock], ...] = tuple([] for _ in range(width))
    for i in range(n):
        cached = get(i)
        if cached is None:
            break
        for lst, blk in zip(hit, cached, strict=True):
            lst.append(blk)
    return hit


def _from_right(
    get: Lookup, n: int, width: int, needed: int, null: KVCacheBlock, bs: int, alignment: int
) -> tuple[tuple[list[KVCacheBlock], ...], bool]:
    """The rightmost run of ``needed`` cached blocks ending on an aligned
    length, nulls before it (found); else the run from block 0 (not found)."""
    hit = tuple([null] * n for _ in range(width))
    run = 0
    for i in range(n - 1, -1, -1):
        cached = get(i)
        if cached is None:
            run = 0
            continue
        if run == 0 and bs != alignment and (i + 1) * bs % alignment:
            continue  # a run must end on an aligned length
        for lst, blk in zip(hit, cached, strict=True):
            lst[i] = blk
        run += 1
        if run >= needed:
            for lst in hit:
                del lst[i + run :]
            return hit, True
    for lst in hit:  # the run ending at block 0 (if any) is a hit of its own length
        del lst[run:]
    return hit, False


def _drop_last(hit: tuple[list[KVCacheBlock], ...]) -> None:
    """Eagle recomputes the last hit block."""
    if hit[0]:
        for lst in hit:
            lst.pop()


def _align(hit: tuple[list[KVCacheBlock], ...], bs: int, alignment: int) -> None:
    while bs != alignment and len(hit[0]) * bs % alignment:
        for lst in hit:
            lst.pop()
