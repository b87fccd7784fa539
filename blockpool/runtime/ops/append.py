"""Append decode tokens to a request: the record, its handler and its declaration."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.core.errors import NotEnoughBlocksError
from blockpool.runtime.errors import NotEnoughBlocks
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import (
    OpRecord,
    OpSpec,
    Outcome,
    RuntimeState,
    check_tokens,
    managed_of,
)
from blockpool.runtime.ops.fields import RequestId, TokenId


@shape
class Appended(TypedDict):
    """The blocks the new tokens needed (per group) and the new length."""

    request_id: str
    new_block_ids: list[list[int]]
    num_tokens: int


class AppendOp(OpRecord[Appended], kw_only=True):
    """Append decode tokens to a running request."""

    op: Literal["append"] = "append"
    request_id: RequestId
    token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1, examples=[[10, 11]])]


def append(rt: RuntimeState, op: AppendOp) -> Outcome[Appended]:
    managed = managed_of(rt, op.request_id, "append")
    before_tokens = managed.num_tokens
    check_tokens(rt, before_tokens + len(op.token_ids), "append")
    before_cached = managed.num_cached_blocks
    try:
        added = rt.manager.append_tokens(op.request_id, op.token_ids)
    except NotEnoughBlocksError as exc:
        raise NotEnoughBlocks(
            f"append: {exc}", requested=exc.requested, free=exc.free, request_id=op.request_id
        ) from None
    bs = rt.manager.block_size
    rt.tail_waste += (len(added[0]) * bs - len(op.token_ids)) * len(added)
    sync: list[Any] = []
    for table, new_ids in zip(managed.block_tables, added, strict=True):
        sync.append(new_ids)
        sync.append([b.block_id for b in table[before_cached : managed.num_cached_blocks]])
    result: Appended = {
        "request_id": op.request_id,
        "new_block_ids": added,
        "num_tokens": managed.num_tokens,
    }
    change = Change(
        ChangeKind.APPEND,
        sync=sync,
        request_id=op.request_id,
        managed=managed,
        before_tokens=before_tokens,
        before_cached=before_cached,
        added=added,
        write_from=before_tokens,
        allocated=sum(len(a) for a in added),
    )
    return result, change


SPEC = OpSpec(AppendOp, append, ChangeKind.APPEND)
