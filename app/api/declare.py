"""How a route declares its response: its success status documented by the
model the handler returns (app/pool/views/, or a library shape the handler
returns as built, ``AsBuilt[Allocated]``: a ``TypedDict``, or a stdlib
dataclass where the schema declares defaults), one auth dependency, a
summary."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import BaseModel, GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    # a view (a pydantic model) or a shape (a TypedDict or a dataclass,
    # blockpool/common/shapes.py)
    Model = type[BaseModel] | type[Mapping[str, Any]] | type[DataclassInstance]
    AsBuilt = Annotated[S, ...]
else:

    class AsBuilt:
        """``AsBuilt[Allocated]``, a handler's return type: the response is
        the ``TypedDict`` the handler built (mypy checks it), documented by
        that shape's schema (``/openapi.json``) and sent as built: neither
        validated (a model instance is not either) nor serialized by the
        shape, the dict's plain JSON (pydantic's ``SkipValidation`` would
        serialize it twice, to Python objects and then to JSON).  A
        dataclass shape is sent as its fields, in their order."""

        def __class_getitem__(cls, shape: Any) -> Any:
            return Annotated[shape, cls()]

        def __get_pydantic_core_schema__(
            self, source: Any, handler: GetCoreSchemaHandler
        ) -> CoreSchema:
            # the shape is what JSON input would be checked against and what
            # the schema documents; a Python value passes as it is
            return core_schema.json_or_python_schema(
                json_schema=handler(source),
                python_schema=core_schema.any_schema(),
                serialization=core_schema.simple_ser_schema("any"),
            )


def returns(model: Model, status: int = 200) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: its success status documented by ``model``."""
    doc = (model.__doc__ or model.__name__).strip().splitlines()[0]
    return {status: {"model": model, "description": doc}}


def route(
    method: Callable[..., Callable[[F], F]],
    path: str,
    model: Model,
    summary: str,
    auth: Any,
) -> Callable[[F], F]:
    """A route as most are declared: ``router.get`` or ``router.post`` with
    its documented response, one auth dependency and the summary.  Only the
    keys a view sets are sent (``exclude_unset``): an optional field it
    leaves out stays out, as it always has."""
    return method(
        path,
        responses=returns(model),
        dependencies=[auth],
        summary=summary,
        response_model_exclude_unset=True,
    )
