"""How a route declares its response: its success status documented by the
model the handler returns (app/pool/views/), one auth dependency, a summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

F = TypeVar("F", bound=Callable[..., Any])


def returns(model: type[BaseModel], status: int = 200) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: its success status documented by ``model``."""
    doc = (model.__doc__ or model.__name__).strip().splitlines()[0]
    return {status: {"model": model, "description": doc}}


def route(
    method: Callable[..., Callable[[F], F]],
    path: str,
    model: type[BaseModel],
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
