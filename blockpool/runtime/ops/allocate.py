"""Allocate raw blocks: the record, its handler and its declaration."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.errors import NotEnoughBlocks, TooLarge
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState
from blockpool.runtime.ops.fields import Count


@shape
class Allocated(TypedDict):
    """The new blocks (queue head first) and the cached ones evicted to get them."""

    block_ids: list[int]
    evicted: list[int]
    """cached blocks whose hash was dropped"""


SMALL = 8  # blocks an allocation counts one by one


class AllocateOp(OpRecord[Allocated], kw_only=True):
    """get_new_blocks(num_blocks): blocks from the queue's head, ref count 1."""

    op: Literal["allocate"] = "allocate"
    num_blocks: Annotated[Count, msgspec.Meta(examples=[4])]


def allocate(rt: RuntimeState, op: AllocateOp) -> Outcome[Allocated]:
    n = op.num_blocks
    limit = rt.caps.max_ids_per_call
    if n > limit:
        raise TooLarge(f"allocate: {n} blocks in one call, the limit is {limit}", limit=limit)
    free = rt.pool.get_num_free_blocks()
    if n > free:
        raise NotEnoughBlocks(
            f"allocate needs {n} free block(s) but only {free} are free", requested=n, free=free
        )
    blocks = rt.pool.get_new_blocks(n)
    ids = [b.block_id for b in blocks]
    hashed = rt.columns.hashed
    evicted = [i for i in ids if hashed[i]]
    raw = rt.raw_refs
    if n <= SMALL:  # a decode's block or two: numpy's fancy indexing costs ~3 us a call
        for i in ids:
            raw[i] += 1
    else:
        raw[ids] += 1  # (distinct ids: each once)
    change = Change(ChangeKind.ALLOCATE, sync=[ids], ids=ids, allocated=n)
    return {"block_ids": ids, "evicted": evicted}, change


SPEC = OpSpec(AllocateOp, allocate, ChangeKind.ALLOCATE)
