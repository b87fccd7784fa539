"""The operations a runtime applies: one module each, registered here.

Each module of this package declares one operation once: its record (a
msgspec struct: the fields with their bounds, ``op`` first, the recording's
wire order; ``OpRecord[Result]`` names its result), its result (a
``TypedDict``, blockpool/common/shapes.py: the one declaration of what it
returns, the service's response model too), its handler (validates the whole
operation, then changes the pool, builds the result; a refusal raises an
``OperationError`` before any change) and its
``OpSpec`` (the handler, and the kind of change it reports, None for a
read).  ``SPECS`` lists them; ``Op`` is their union.  ``ENGINE_SPECS``: the
records only an engine's stream applies (a mirror), each exported as the
REST operation it equals (``public_form``); not in the API.  The service's request
bodies and OpenAPI schemas are derived from the records (app/pool/schemas.py).

Adding an operation: a module here (result, record, handler, ``SPEC``), its entry in
``SPECS`` and ``Op``, and its test (docs/architecture.md).
"""

from __future__ import annotations

from typing import Any, cast

import msgspec

from blockpool.runtime.errors import TooLarge
from blockpool.runtime.ops import (
    admit,
    allocate,
    append,
    cache,
    evict,
    finish,
    free,
    lookup,
    prefix_lookup,
    reset,
    touch,
)
from blockpool.runtime.ops.admit import AdmitOp, Admitted
from blockpool.runtime.ops.allocate import Allocated, AllocateOp
from blockpool.runtime.ops.append import Appended, AppendOp
from blockpool.runtime.ops.base import (
    AnyOpSpec,
    OpRecord,
    OpSpec,
    Outcome,
    RuntimeState,
    check_ids,
    check_tokens,
)
from blockpool.runtime.ops.cache import Cached, CacheOp, EngineCached, EngineCacheOp
from blockpool.runtime.ops.evict import Evicted, EvictOp
from blockpool.runtime.ops.fields import BlockId, ExtraKey, GroupId, HexHash, RequestId, TokenId
from blockpool.runtime.ops.finish import Finished, FinishOp
from blockpool.runtime.ops.free import Freed, FreeOp
from blockpool.runtime.ops.lookup import Lookup, LookupOp
from blockpool.runtime.ops.prefix_lookup import PrefixLookup, PrefixLookupOp
from blockpool.runtime.ops.reset import Reset, ResetOp
from blockpool.runtime.ops.touch import Touched, TouchOp

Op = (
    AllocateOp
    | FreeOp
    | TouchOp
    | CacheOp
    | LookupOp
    | PrefixLookupOp
    | EvictOp
    | ResetOp
    | AdmitOp
    | AppendOp
    | FinishOp
    | EngineCacheOp
)

# In the order the API documents them.
SPECS: tuple[AnyOpSpec, ...] = tuple(
    m.SPEC
    for m in (
        allocate,
        free,
        touch,
        cache,
        lookup,
        prefix_lookup,
        evict,
        reset,
        admit,
        append,
        finish,
    )
)
# What an engine's stream applies with the engine's own values (raw hashes).
ENGINE_SPECS: tuple[AnyOpSpec, ...] = (cache.ENGINE_SPEC,)
SPEC_OF: dict[type[OpRecord[Any]], AnyOpSpec] = {s.record: s for s in (*SPECS, *ENGINE_SPECS)}
# by class name: what a recording's entries name (engine records too)
OP_CLASSES: dict[str, type[OpRecord[Any]]] = {
    s.record.__name__: s.record for s in (*SPECS, *ENGINE_SPECS)
}
# by operation name: the API's (and an exported recording's) operations
OP_BY_NAME: dict[str, type[OpRecord[Any]]] = {s.name: s.record for s in SPECS}
# Operations that never change the pool (a batch of only these needs no undo).
READ_ONLY: tuple[type[OpRecord[Any]], ...] = tuple(s.record for s in SPECS if s.read_only)


def handle(rt: RuntimeState, op: Op) -> Outcome[dict[str, Any]]:
    """Apply ``op`` with its handler (``PoolRuntime._execute``)."""
    return SPEC_OF[type(op)].apply(rt, op)


def precheck(rt: RuntimeState, op: Op) -> None:
    """Limits that need no pool state (run on a whole batch before any op)."""
    ids = getattr(op, "block_ids", None)
    if isinstance(ids, list):
        check_ids(rt, ids, op.op)
    tokens = getattr(op, "token_ids", None)
    if isinstance(tokens, list):
        check_tokens(rt, len(tokens), op.op)
    limit = rt.caps.max_ids_per_call
    if isinstance(op, AllocateOp) and op.num_blocks > limit:
        raise TooLarge(
            f"allocate: {op.num_blocks} blocks in one call, the limit is {limit}", limit=limit
        )


def public_form(op: Op, ok: bool, payload: Any) -> tuple[Op, Any]:
    """``op`` and its result (or error body) as the API names them: an
    engine's record as the REST operation it equals, others as they are."""
    convert = SPEC_OF[type(op)].public
    if convert is None:
        return op, payload
    public, out = convert(op, ok, payload)
    return cast(Op, public), out


def op_from_fields(name: str, fields: dict[str, Any]) -> Op:
    """The operation ``name`` (its class name) with these fields."""
    op: Op = OP_CLASSES[name](**fields)  # type: ignore[assignment]
    return op


def op_from_json(d: object) -> Op:
    """Validate untrusted JSON (a dict with ``op``) into an operation;
    ValueError naming what is wrong."""
    if not isinstance(d, dict) or not isinstance(d.get("op"), str):
        raise ValueError("an operation is an object with an 'op' name")
    cls = OP_BY_NAME.get(d["op"])
    if cls is None:
        raise ValueError(f"unknown operation {d['op']!r}")
    try:
        op: Op = msgspec.convert(d, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise ValueError(f"operation {d['op']!r}: {exc}") from None
    return op


__all__ = [
    "ENGINE_SPECS",
    "OP_BY_NAME",
    "OP_CLASSES",
    "READ_ONLY",
    "SPECS",
    "SPEC_OF",
    "AdmitOp",
    "Admitted",
    "AllocateOp",
    "Allocated",
    "AnyOpSpec",
    "AppendOp",
    "Appended",
    "BlockId",
    "CacheOp",
    "Cached",
    "EngineCacheOp",
    "EngineCached",
    "EvictOp",
    "Evicted",
    "ExtraKey",
    "FinishOp",
    "Finished",
    "FreeOp",
    "Freed",
    "GroupId",
    "HexHash",
    "Lookup",
    "LookupOp",
    "Op",
    "OpRecord",
    "OpSpec",
    "PrefixLookup",
    "PrefixLookupOp",
    "RequestId",
    "Reset",
    "ResetOp",
    "RuntimeState",
    "TokenId",
    "TouchOp",
    "Touched",
    "handle",
    "op_from_fields",
    "op_from_json",
    "precheck",
    "public_form",
]
