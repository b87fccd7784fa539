"""Evict blocks' cached hashes: the record, its handler and its declaration."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState, check_ids
from blockpool.runtime.ops.fields import BlockId


@shape
class Evicted(TypedDict):
    """Blocks whose hash was dropped, and those that held none."""

    evicted: list[int]
    not_cached: list[int]


class EvictOp(OpRecord[Evicted], kw_only=True):
    """evict_blocks(ids): drop cached hashes; held blocks stay held."""

    op: Literal["evict"] = "evict"
    block_ids: Annotated[list[BlockId], msgspec.Meta(examples=[[5]])]


def evict(rt: RuntimeState, op: EvictOp) -> Outcome[Evicted]:
    check_ids(rt, op.block_ids, "evict")  # the ids as given (as /batch checks them)
    ids = list(dict.fromkeys(op.block_ids))
    hashed = rt.columns.hashed
    evicted = [i for i in ids if hashed[i]]
    rt.pool.evict_blocks(ids)
    gone = set(evicted)
    result: Evicted = {"evicted": evicted, "not_cached": [i for i in ids if i not in gone]}
    return result, Change(ChangeKind.EVICT, sync=[ids], ids=evicted)


SPEC = OpSpec(EvictOp, evict, ChangeKind.EVICT)
