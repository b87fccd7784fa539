"""A dry run: would these operations, applied in order, all succeed?

The runtime is the single writer, so a batch can be tried first on a scratch
copy of its state (a keyframe restored into a spare runtime of the same
configuration): nothing of the real runtime changes, nothing is recorded,
observed or published.  The operations are deterministic, so a batch that
succeeds on the copy succeeds the same way on the real runtime.  O(blocks)
for the copy plus the operations themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blockpool.runtime.errors import OperationError
from blockpool.runtime.ops import READ_ONLY
from blockpool.runtime.runtime import PoolRuntime
from blockpool.runtime.state import restore, snapshot


def mutating(ops: Sequence[Any]) -> int:
    """How many of the operations change state (lookups do not)."""
    return sum(1 for op in ops if not isinstance(op, READ_ONLY))


def first_refusal(rt: PoolRuntime, ops: Sequence[Any]) -> tuple[int, OperationError] | None:
    """Apply ``ops`` in order to a copy of ``rt``'s state; the index and
    error of the first refused one, or None when all would succeed."""
    scratch = rt._spare
    if scratch is None or scratch.config != rt.config:
        scratch = rt._spare = PoolRuntime(rt.config)
    restore(scratch, snapshot(rt, 0, 0.0), check=False)
    for i, op in enumerate(ops):
        try:
            scratch._execute(op)
        except OperationError as exc:
            return i, exc
    return None
