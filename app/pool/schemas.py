"""Request bodies, derived from the operations' records (blockpool/runtime/ops/).

Each operation is declared once, as a msgspec record in the library; the
pydantic model FastAPI validates and documents (OpenAPI) is built from that
record here -- same name, fields, bounds, defaults, descriptions and
examples -- so the two cannot drift (tests/app/test_op_bodies.py checks the
schemas agree).  A route takes the record itself (``Body[AllocateOp]``): the
validated body arrives converted.

Shapes are checked here (pydantic); limits that come from settings and
everything that depends on the pool's state are checked by the handlers
before anything changes.
"""

from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec
from fastapi import Depends
from pydantic import BaseModel, ConfigDict, Field, create_model

from blockpool.runtime import ops as rops
from blockpool.runtime.ops import (
    SPECS,
    AdmitOp,
    AllocateOp,
    AppendOp,
    CacheOp,
    EvictOp,
    FinishOp,
    FreeOp,
    LookupOp,
    Op,
    OpRecord,
    PrefixLookupOp,
    ResetOp,
    TouchOp,
)

_META_KEYS = ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")
_DOC_KEYS = ("title", "description", "examples")


def field_type(tp: Any) -> Any:
    """The pydantic annotation for a record's field type (msgspec.Meta -> Field)."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *metas = get_args(tp)
        fields = [
            Field(**{k: v for k in (*_META_KEYS, *_DOC_KEYS) if (v := getattr(m, k)) is not None})
            for m in metas
            if isinstance(m, msgspec.Meta)
        ]
        return Annotated[(field_type(base), *fields)] if fields else field_type(base)
    if origin is list:
        return list[field_type(get_args(tp)[0])]  # type: ignore[misc]
    if origin in (Union, types.UnionType):
        return Union[tuple(field_type(a) for a in get_args(tp))]  # noqa: UP007
    return tp


class _Strict(BaseModel):
    # strict: a JSON string or boolean is not silently taken for a number
    # ({"num_blocks": true} would otherwise allocate one block).
    model_config = ConfigDict(extra="forbid", strict=True)


def body_model(record: type[OpRecord[Any]]) -> type[BaseModel]:
    """The request body model of an operation record (same name and fields)."""
    hints = inspect.get_annotations(record, eval_str=True)
    for klass in record.__mro__[1:]:
        for name, tp in inspect.get_annotations(klass, eval_str=True).items():
            hints.setdefault(name, tp)
    fields: dict[str, Any] = {}
    for f in msgspec.structs.fields(record):
        tp = field_type(hints[f.name])
        if f.name == "op":
            tp = Literal[f.default]  # the discriminator of /batch's operations
        if f.default_factory is not msgspec.NODEFAULT:
            fields[f.name] = (tp, Field(default_factory=f.default_factory))
        elif f.default is not msgspec.NODEFAULT:
            fields[f.name] = (tp, f.default)
        else:
            fields[f.name] = (tp, ...)
    model: type[BaseModel] = create_model(
        record.__name__, __base__=_Strict, __module__=__name__, **fields
    )
    model.__doc__ = record.__doc__
    return model


BODIES: dict[type[OpRecord[Any]], type[BaseModel]] = {s.record: body_model(s.record) for s in SPECS}
_RECORDS: dict[type[BaseModel], type[OpRecord[Any]]] = {m: r for r, m in BODIES.items()}


def to_op(body: BaseModel) -> Op:
    """A validated request body as its operation record (TypeError for any
    other object: nothing passes through unconverted)."""
    record = _RECORDS.get(type(body))
    if record is None:
        raise TypeError(f"not an operation body: {type(body).__name__}")
    op: Op = record(**{f: getattr(body, f) for f in record.__struct_fields__})  # type: ignore[assignment]
    return op


R = TypeVar("R", bound=OpRecord[Any])


def op_body(record: type[R]) -> Any:
    """A FastAPI dependency: the request body validated by ``record``'s model,
    handed to the route as the record."""
    model = BODIES[record]

    def body_as_op(body: BaseModel) -> Op:
        return to_op(body)

    param = inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model)
    body_as_op.__signature__ = inspect.Signature([param])  # type: ignore[attr-defined]
    return Depends(body_as_op)


# The annotations routes take their operation bodies with.
AllocateBody = Annotated[AllocateOp, op_body(AllocateOp)]
FreeBody = Annotated[FreeOp, op_body(FreeOp)]
TouchBody = Annotated[TouchOp, op_body(TouchOp)]
CacheBody = Annotated[CacheOp, op_body(CacheOp)]
EvictBody = Annotated[EvictOp, op_body(EvictOp)]
PrefixLookupBody = Annotated[PrefixLookupOp, op_body(PrefixLookupOp)]
AdmitBody = Annotated[AdmitOp, op_body(AdmitOp)]

if TYPE_CHECKING:
    HexHash = str
    GroupId = int
    TokenId = int
    OpBodyUnion = BaseModel
else:
    # query parameters and fields with the records' bounds
    HexHash = field_type(rops.HexHash)
    GroupId = field_type(rops.GroupId)
    TokenId = field_type(rops.TokenId)
    OpBodyUnion = Annotated[Union[tuple(BODIES.values())], Field(discriminator="op")]  # noqa: UP007


class BatchRequest(_Strict):
    """Many operations in one call, applied in order.  ``on_error``:
    ``rollback`` (default): all or nothing -- when any operation would be
    refused, the batch changes nothing and the refusal is the answer;
    ``stop``: apply up to the first refused operation, skip the rest;
    ``continue``: apply every operation that can be applied.
    All or nothing costs about twice the operations themselves (a dry run on
    a spare kept in step; bench/bench_batch_atomic.py)."""

    ops: list[OpBodyUnion] = Field(min_length=1)
    on_error: Literal["rollback", "stop", "continue"] = "rollback"

    def operations(self) -> list[Op]:
        """The operations as records, in order."""
        return [to_op(b) for b in self.ops]


class AppendBody(_Strict):
    token_ids: list[TokenId] = Field(min_length=1, examples=[[10, 11]])


class DemoConfig(_Strict):
    """Demo workload settings; omitted fields keep their value."""

    rate: float | None = Field(default=None, ge=0, le=500, description="requests per second")
    mix: dict[str, float] | None = Field(
        default=None,
        description="relative weights of chat, conversation, document, noise",
        examples=[{"chat": 4, "conversation": 3, "document": 2, "noise": 1}],
    )
    decode_tokens: tuple[int, int] | None = Field(
        default=None,
        strict=False,  # a JSON array (strict would want a Python tuple); items stay strict
        description="min and max decode tokens per request",
    )
    max_running: int | None = Field(default=None, ge=1, le=100_000)


__all__ = [
    "BODIES",
    "AdmitBody",
    "AdmitOp",
    "AllocateBody",
    "AllocateOp",
    "AppendBody",
    "AppendOp",
    "BatchRequest",
    "CacheBody",
    "CacheOp",
    "DemoConfig",
    "EvictBody",
    "EvictOp",
    "FinishOp",
    "FreeBody",
    "FreeOp",
    "GroupId",
    "HexHash",
    "LookupOp",
    "PrefixLookupBody",
    "PrefixLookupOp",
    "ResetOp",
    "TokenId",
    "TouchBody",
    "TouchOp",
    "body_model",
    "op_body",
    "to_op",
]
