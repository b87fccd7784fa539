"""Reset the prefix cache: the record, its handler and its declaration."""

from __future__ import annotations

from typing import Literal

from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.errors import ResetRefused
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState


@shape
class Reset(TypedDict):
    """The prefix cache was cleared."""

    reset: bool


class ResetOp(OpRecord[Reset], kw_only=True):
    """reset_prefix_cache(): refused while any block is held."""

    op: Literal["reset"] = "reset"


def reset(rt: RuntimeState, op: ResetOp) -> Outcome[Reset]:  # noqa: ARG001 every op handler takes its op
    pool = rt.pool
    held = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    if not pool.reset_prefix_cache():
        rt.counters.resets_refused += 1
        raise ResetRefused(
            f"reset refused: {held} block(s) are still held; free them or finish the "
            f"{len(rt.manager.requests)} running request(s) first",
            held_blocks=held,
            running_requests=len(rt.manager.requests),
        )
    rt.counters.resets += 1
    return {"reset": True}, Change(ChangeKind.RESET)


SPEC = OpSpec(ResetOp, reset, ChangeKind.RESET)
