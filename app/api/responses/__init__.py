"""What every route returns, as pydantic models (one module per router:
pool_routes, inspect, requests, analysis, operator, stream, trace), for the docs (``/docs``,
``/openapi.json``) and for the schema checks of the suite.

The models document; they do not re-shape: each route declares its model with
``responses=returns(Model)`` and still returns its plain ``dict``, serialised as
before (no validation pass, no key dropped or re-typed, nothing slower).  The
suite holds the two together: schemathesis validates every response against
these schemas, and tests/app/test_docs_offline.py checks real responses of
every operation against them, and that every top-level key they hold is
declared here.  ``extra="allow"``: a model names what is there today without
promising that nothing will ever be added.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

F = TypeVar("F", bound=Callable[..., Any])


class Out(BaseModel):
    model_config = ConfigDict(extra="allow")


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
    its documented response, one auth dependency and the summary."""
    return method(path, responses=returns(model), dependencies=[auth], summary=summary)


Hashes = list[str]
Ids = list[int]
PerGroupIds = list[list[int]]
