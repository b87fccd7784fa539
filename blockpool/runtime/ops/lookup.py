"""Look one hash up in the cache (a read): the record, its handler and its declaration."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.core.hashing import BlockHash
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState
from blockpool.runtime.ops.fields import GroupId, HexHash


@shape
class Lookup(TypedDict):
    """A hit in every group (block ids per group) or a miss."""

    hit: bool
    group_ids: list[int]
    block_ids: list[int] | None
    """one block per group on a hit, null on a miss"""


class LookupOp(OpRecord[Lookup], kw_only=True):
    """get_cached_block(hash, group_ids): one block per group, or a miss."""

    op: Literal["lookup"] = "lookup"
    block_hash: HexHash
    group_ids: Annotated[list[GroupId], msgspec.Meta(min_length=1, max_length=64)] = msgspec.field(
        default_factory=lambda: [0]
    )


def lookup(rt: RuntimeState, op: LookupOp) -> Outcome[Lookup]:
    found = rt.pool.get_cached_block(BlockHash(bytes.fromhex(op.block_hash)), op.group_ids)
    result: Lookup = {
        "hit": found is not None,
        "group_ids": op.group_ids,
        "block_ids": None if found is None else [b.block_id for b in found],
    }
    return result, None


SPEC = OpSpec(LookupOp, lookup, None)
