"""The operations a runtime applies, as plain typed records.

Shapes and ranges are the caller's to check (the service validates JSON
bodies with its own models and converts them to these); limits that come
from the configuration and everything that depends on the pool's state are
checked by the handlers before anything changes.  Field order is the
recording's wire order (``op`` first).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

# The same bounds the service's request models declare (app/schemas.py).
BlockId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
GroupId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
HexHash = Annotated[str, msgspec.Meta(pattern=r"^(?:[0-9a-fA-F]{2}){1,64}$")]
RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
ExtraKey = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class AllocateOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "allocate"
    num_blocks: Count


class FreeOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "free"
    block_ids: list[BlockId]


class TouchOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "touch"
    block_ids: list[BlockId]


class CacheOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "cache"
    block_ids: Annotated[list[BlockId], msgspec.Meta(min_length=1)]
    token_ids: list[TokenId] | None = None
    block_hashes: list[HexHash] | None = None
    parent_block_hash: HexHash | None = None
    group_id: GroupId = 0
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


class LookupOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "lookup"
    block_hash: HexHash
    group_ids: Annotated[list[GroupId], msgspec.Meta(min_length=1, max_length=64)] = msgspec.field(
        default_factory=lambda: [0]
    )


class PrefixLookupOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "prefix_lookup"
    token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)]
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


class EvictOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "evict"
    block_ids: list[BlockId]


class ResetOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "reset"


class AdmitOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "admit"
    request_id: RequestId | None = None
    token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)]
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


class AppendOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "append"
    request_id: RequestId
    token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)]


class FinishOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: str = "finish"
    request_id: RequestId


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
)

OP_CLASSES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        AllocateOp,
        FreeOp,
        TouchOp,
        CacheOp,
        LookupOp,
        PrefixLookupOp,
        EvictOp,
        ResetOp,
        AdmitOp,
        AppendOp,
        FinishOp,
    )
}
# Operations that never change the pool (a batch of only these needs no undo).
READ_ONLY = (LookupOp, PrefixLookupOp)


def op_from_fields(name: str, fields: dict[str, Any]) -> Any:
    """The operation ``name`` (its class name) with these fields."""
    return OP_CLASSES[name](**fields)


OP_BY_NAME: dict[str, type[Any]] = {cls.__struct_defaults__[0]: cls for cls in OP_CLASSES.values()}


def op_from_json(d: Any) -> Any:
    """Validate untrusted JSON (a dict with ``op``) into an operation;
    ValueError naming what is wrong."""
    if not isinstance(d, dict) or not isinstance(d.get("op"), str):
        raise ValueError("an operation is an object with an 'op' name")
    cls = OP_BY_NAME.get(d["op"])
    if cls is None:
        raise ValueError(f"unknown operation {d['op']!r}")
    try:
        return msgspec.convert(d, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise ValueError(f"operation {d['op']!r}: {exc}") from None
