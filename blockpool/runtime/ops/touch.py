"""Touch blocks (one more reference each): the record, its handler and its declaration."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.errors import Conflict
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState, blocks_of, check_ids
from blockpool.runtime.ops.fields import BlockId


@shape
class Touched(TypedDict):
    """Each block's ref count after the touch."""

    block_ids: list[int]
    ref_cnts: list[int]


class TouchOp(OpRecord[Touched], kw_only=True):
    """touch(blocks): one more reference each (a free block leaves the queue)."""

    op: Literal["touch"] = "touch"
    block_ids: Annotated[list[BlockId], msgspec.Meta(examples=[[1, 2]])]


def touch(rt: RuntimeState, op: TouchOp) -> Outcome[Touched]:
    ids = op.block_ids
    check_ids(rt, ids, "touch")
    if 0 in ids:
        raise Conflict("touch: block 0 is the null block; it cannot be touched", block_id=0)
    blocks = blocks_of(rt, ids)
    rt.pool.touch(blocks)
    for bid in ids:
        rt.raw_refs[bid] += 1
    rt.counters.blocks_touched += len(ids)
    result: Touched = {"block_ids": list(ids), "ref_cnts": [b.ref_cnt for b in blocks]}
    return result, Change(ChangeKind.TOUCH, sync=[ids])


SPEC = OpSpec(TouchOp, touch, ChangeKind.TOUCH)
