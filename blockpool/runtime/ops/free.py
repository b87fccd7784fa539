"""Free raw blocks: the record, its handler and its declaration."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.errors import Conflict
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState, blocks_of, check_ids
from blockpool.runtime.ops.fields import BlockId


@shape
class Freed(TypedDict):
    """The blocks whose ref count reached 0 (appended to the queue's tail)."""

    freed: list[int]
    now_free: list[int]


class FreeOp(OpRecord[Freed], kw_only=True):
    """free_blocks(ordered): the first id is evicted first (free a chain in reverse)."""

    op: Literal["free"] = "free"
    block_ids: Annotated[list[BlockId], msgspec.Meta(examples=[[3, 2, 1]])]


def free(rt: RuntimeState, op: FreeOp) -> Outcome[Freed]:
    ids = op.block_ids
    check_ids(rt, ids, "free")
    raw = rt.raw_refs
    pool_blocks = rt.pool.blocks
    for bid, times in Counter(ids).items():
        if bid == 0:
            raise Conflict("free: block 0 is the null block; it is never freed", block_id=0)
        held = int(raw[bid])
        if times > held:
            ref = pool_blocks[bid].ref_cnt
            if ref == 0:
                msg = f"free: block {bid} is already free"
            elif held == 0:
                msg = (
                    f"free: block {bid} is held by a request, not through the block API; "
                    "finish the request instead"
                )
            else:
                msg = f"free: block {bid} is held {held} time(s) but would be freed {times} time(s)"
            raise Conflict(msg, block_id=bid, held=held, freed=times, ref_cnt=ref)
    blocks = blocks_of(rt, ids)
    rt.pool.free_blocks(blocks)
    for bid in ids:
        raw[bid] -= 1
    rt.counters.blocks_freed += len(ids)
    now_free = [b.block_id for b in blocks if b.ref_cnt == 0]
    return {"freed": list(ids), "now_free": now_free}, Change(
        ChangeKind.FREE, sync=[ids], freed=[blocks]
    )


SPEC = OpSpec(FreeOp, free, ChangeKind.FREE)
