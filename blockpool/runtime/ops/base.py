"""What every operation module uses: the record base class, what a handler
may change (``RuntimeState``), the declaration (``OpSpec``) and the checks
handlers share.  The field bounds are in ``fields.py``.

An operation is declared once, in a module of this package: its record (the
fields with their bounds, in the recording's wire order, ``op`` first), its
result (a ``TypedDict``, blockpool/common/shapes.py: the record names it,
``OpRecord[Result]``, and the handler builds it), its handler, whether it is
read-only and which kind of change it reports.  The service derives its
request bodies and OpenAPI schemas from the records (app/pool/schemas.py)
and declares the results as its response models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import msgspec

from blockpool.core.errors import RequestFinishedError, UnknownRequestError
from blockpool.runtime.errors import Conflict, InvalidInput, NotFound, TooLarge

if TYPE_CHECKING:
    import numpy as np

    from blockpool.core.block import KVCacheBlock
    from blockpool.core.hashing import HashFn
    from blockpool.core.manager import ManagedRequest, RequestManager
    from blockpool.core.pool import BlockPool
    from blockpool.runtime.columns import BlockColumns
    from blockpool.runtime.config import Caps, RuntimeConfig
    from blockpool.runtime.counters import Counters
    from blockpool.runtime.observer import Change, ChangeKind


R = TypeVar("R")


class OpRecord(msgspec.Struct, Generic[R], kw_only=True, forbid_unknown_fields=True):
    """The base of every operation's record; each starts with ``op``, its
    name (a literal with that default).  ``R``: what applying it returns
    (its result's ``TypedDict``; no field, only the type)."""


class RuntimeState(Protocol):
    """What the handlers change (blockpool.runtime.runtime.PoolRuntime)."""

    config: RuntimeConfig
    caps: Caps  # the limits of the operation being applied (PoolRuntime.execute)
    pool: BlockPool
    manager: RequestManager
    columns: BlockColumns
    raw_refs: np.ndarray
    counters: Counters
    hash_fn: HashFn
    tail_waste: int

    def new_request_id(self) -> str: ...


# What a handler returns: its result (``Outcome[Allocated]``) and the change.
# The registry holds every handler as one of ``Outcome[dict[str, Any]]``.
Outcome = tuple[R, "Change | None"]
T = TypeVar("T", bound="OpRecord[Any]")


@dataclass(frozen=True)
class OpSpec(Generic[T, R]):
    """One operation: its record class, its handler, whether it only reads,
    and the kind of change it reports (None for a read).  ``public``: for an
    engine's record (not the REST API's), the REST operation it equals and
    its result, given (record, ok, result or error body): what a recording
    exports."""

    record: type[T]
    handler: Callable[[RuntimeState, T], Outcome[R]]
    change: ChangeKind | None
    public: Callable[[T, bool, Any], tuple[OpRecord[Any], Any]] | None = None
    # the handler as the registry calls it, on any record: ``SPEC_OF`` hands
    # each record to its own spec (the handler itself: no call in between)
    apply: Callable[[RuntimeState, OpRecord[Any]], Outcome[dict[str, Any]]] = field(
        init=False, repr=False, compare=False
    )

    @property
    def name(self) -> str:
        """The operation's name on the wire (the record's ``op`` default)."""
        default = msgspec.structs.fields(self.record)[0].default
        assert isinstance(default, str)
        return default

    @property
    def read_only(self) -> bool:
        return self.change is None

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "apply",
            cast(Callable[[RuntimeState, OpRecord[Any]], Outcome[dict[str, Any]]], self.handler),
        )


class AnyOpSpec(Protocol):
    """An ``OpSpec`` of whichever operation, as the registry holds them all
    (blockpool/runtime/ops/__init__.py): its record, its change, and
    ``apply`` on a record of that operation."""

    @property
    def record(self) -> type[OpRecord[Any]]: ...

    @property
    def change(self) -> ChangeKind | None: ...

    @property
    def name(self) -> str: ...

    @property
    def read_only(self) -> bool: ...

    @property
    def public(self) -> Callable[[Any, bool, Any], tuple[OpRecord[Any], Any]] | None: ...

    def apply(self, rt: RuntimeState, op: OpRecord[Any]) -> Outcome[dict[str, Any]]: ...


def check_ids(rt: RuntimeState, ids: Sequence[int], what: str) -> None:
    limit = rt.caps.max_ids_per_call
    if len(ids) > limit:
        raise TooLarge(
            f"{what}: {len(ids)} block ids in one call, the limit is {limit}",
            given=len(ids),
            limit=limit,
        )
    n = rt.pool.num_gpu_blocks
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise InvalidInput(
            f"{what}: block id {bad[0]} is outside the pool (ids 0..{n - 1})",
            invalid_ids=bad[:20],
            num_blocks=n,
        )


def check_tokens(rt: RuntimeState, n: int, what: str) -> None:
    limit = rt.caps.max_tokens_per_request
    if n > limit:
        raise TooLarge(
            f"{what}: {n} tokens, the limit per request is {limit}", given=n, limit=limit
        )


def blocks_of(rt: RuntimeState, ids: Sequence[int]) -> list[KVCacheBlock]:
    blocks = rt.pool.blocks
    return [blocks[i] for i in ids]


def managed_of(rt: RuntimeState, rid: str, what: str) -> ManagedRequest:
    """The running request ``rid``; NotFound / Conflict naming ``what``."""
    try:
        return rt.manager.get(rid)
    except RequestFinishedError:
        raise Conflict(f"{what}: request {rid!r} was already finished", request_id=rid) from None
    except UnknownRequestError:
        raise NotFound(f"{what}: no running request {rid!r}", request_id=rid) from None
