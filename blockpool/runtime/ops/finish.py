"""Finish a request: the record, its handler and its declaration."""

from __future__ import annotations

from typing import Literal

from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState, managed_of
from blockpool.runtime.ops.fields import RequestId


@shape
class Finished(TypedDict):
    """The request's blocks, freed in reverse order (per group)."""

    request_id: str
    freed_block_ids: list[list[int]]


class FinishOp(OpRecord[Finished], kw_only=True):
    """Finish a request: its blocks are freed in reverse."""

    op: Literal["finish"] = "finish"
    request_id: RequestId


def finish(rt: RuntimeState, op: FinishOp) -> Outcome[Finished]:
    managed = managed_of(rt, op.request_id, "finish")
    tables = [list(t) for t in managed.block_tables]
    bs = rt.manager.block_size
    rt.tail_waste -= (len(tables[0]) * bs - managed.num_tokens) * len(tables)
    freed = rt.manager.finish(op.request_id)
    rt.counters.requests_finished += 1
    rt.counters.blocks_freed += sum(len(t) for t in freed)
    result: Finished = {"request_id": op.request_id, "freed_block_ids": freed}
    change = Change(
        ChangeKind.FINISH,
        sync=freed,
        freed=[t[::-1] for t in tables],
        request_id=op.request_id,
        managed=managed,
    )
    return result, change


SPEC = OpSpec(FinishOp, finish, ChangeKind.FINISH)
