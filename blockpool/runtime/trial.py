"""All or nothing: would these operations, applied in order, all succeed?

The runtime is the single writer, so a batch can be tried first on a spare
runtime of the same configuration held in the real one's state: nothing of
the real runtime changes, nothing is recorded, observed or published.  The
operations are deterministic and a refused one changes nothing, so a batch
that succeeds on the spare succeeds the same way on the real runtime.

Keeping the spare in step costs what the operations cost, not O(blocks):
after a dry run that succeeded, the spare already holds the state the real
runtime reaches by applying the batch, and from then on the real runtime
journals every operation it applies (``PoolRuntime._execute``); the next dry
run first replays that journal on the spare.  The spare is copied whole
(a keyframe, O(blocks + running requests)) only when it is out of step: the
first time, after a refused dry run, after ``state.restore`` of the real
runtime, or when the journal outgrew ``PoolRuntime._journal_cap``
(replaying it would cost more than the copy; journaling then stops until
the next dry run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from blockpool.core.snapshot import pool_digest
from blockpool.runtime.config import UNCAPPED
from blockpool.runtime.errors import OperationError
from blockpool.runtime.ops import READ_ONLY, Op
from blockpool.runtime.runtime import PoolRuntime
from blockpool.runtime.state import restore, snapshot


class BatchRefused(Exception):
    """Operation ``index`` of the batch would be refused with ``error``;
    nothing was applied."""

    def __init__(self, index: int, error: OperationError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


def mutating(ops: Sequence[Op]) -> int:
    """How many of the operations change state (lookups do not)."""
    return sum(1 for op in ops if not isinstance(op, READ_ONLY))


def _in_step(rt: PoolRuntime) -> PoolRuntime:
    """The spare, in the real runtime's state now."""
    spare = rt._spare
    if spare is None or spare.config != rt.config:
        spare = rt._spare = PoolRuntime(rt.config)
        rt._journal = None
    journal, rt._journal = rt._journal, None  # out of step until a dry run succeeds
    try:
        if journal is None:
            raise LookupError  # copy it whole
        for op in journal:  # applied on the real runtime: they apply here too
            spare._execute(op, UNCAPPED)
    except (LookupError, OperationError):
        restore(spare, snapshot(rt, 0, 0.0), check=False)
    _discard_output(spare)
    if rt.paranoid:  # (tests) the spare is the real runtime's state, exactly
        assert pool_digest(spare.pool, spare.manager) == pool_digest(rt.pool, rt.manager)
        assert spare.request_counter == rt.request_counter
        assert (spare.raw_refs == rt.raw_refs).all()
    return spare


def _discard_output(spare: PoolRuntime) -> None:
    """The spare's events and eviction samples are nobody's: drop them."""
    spare.pool.take_events()
    spare.collector.drain_events()


def first_refusal(rt: PoolRuntime, ops: Sequence[Op]) -> tuple[int, OperationError] | None:
    """Apply ``ops`` in order to the spare; the index and error of the first
    refused one, or None when all would succeed (the spare then holds the
    state after them: see ``apply_all``)."""
    spare = _in_step(rt)
    try:
        for i, op in enumerate(ops):
            try:
                spare._execute(op)
            except OperationError as exc:
                return i, exc
    finally:
        _discard_output(spare)
    return None


def apply_all(
    rt: PoolRuntime,
    ops: Sequence[Op],
    apply: Callable[[Op], dict[str, Any]],
    *,
    dry_run_one: bool = False,
) -> list[dict[str, Any]]:
    """Apply ``ops`` with ``apply`` (the runtime's ``apply``, or a service's
    wrapper of it), all or nothing: raises ``BatchRefused`` before anything
    changes when one of them would be refused.  A batch with one mutating
    operation needs no dry run (an operation is all or nothing by itself)
    unless ``dry_run_one``: then its refusal, like any batch's, happens on
    the spare — nothing of the batch is applied, recorded or counted by the
    runtime (the lookups before it included), whatever its size."""
    if mutating(ops) == 0 or (mutating(ops) == 1 and not dry_run_one):
        out = []
        for i, op in enumerate(ops):
            try:
                out.append(apply(op))
            except OperationError as exc:
                raise BatchRefused(i, exc) from None
        return out
    refused = first_refusal(rt, ops)
    if refused is not None:
        raise BatchRefused(*refused)
    # the spare is already where the batch takes the real runtime: no journal
    out = []
    for i, op in enumerate(ops):
        try:
            out.append(apply(op))
        except OperationError as exc:  # (cannot happen: the dry run applied it)
            raise BatchRefused(i, exc) from None
    rt._journal = []  # in step: journal from here
    return out
