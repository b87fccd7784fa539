"""Dependencies shared by the routes: the engine, auth, running an operation."""

from __future__ import annotations

from typing import Annotated, TypeVar, cast

from fastapi import Depends, Request

from app.pool.engine import Engine
from app.shared.auth import headers_token_ok
from app.shared.errors import Unauthorized
from app.web import auth_first
from blockpool.runtime.ops import Op, OpRecord


def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


EngineDep = Annotated[Engine, Depends(get_engine)]


def token_given(request: Request, token: str) -> bool:
    """Does the request carry ``Authorization: Bearer <token>``?"""
    return headers_token_ok(request.headers, token)


def _check_token(request: Request, token: str) -> None:
    if not headers_token_ok(request.headers, token):
        raise Unauthorized(
            "this endpoint needs 'Authorization: Bearer <token>' with the server's token"
            if not request.headers.get("authorization")
            else "the bearer token is wrong",
        )


def require_write(request: Request) -> None:
    """Every mutating endpoint: the bearer token when the server has one."""
    token = request.app.state.settings.token
    if token is not None:
        _check_token(request, token)


def require_read(request: Request) -> None:
    """Reads: open unless the server protects them too."""
    settings = request.app.state.settings
    if settings.token is not None and settings.protect_reads:
        _check_token(request, settings.token)


WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)
# checked on the headers, before the body is read (app/web/auth_first.py)
auth_first.register(require_write)
auth_first.register(require_read)


R = TypeVar("R")


async def run(engine: Engine, op: OpRecord[R]) -> R:
    """Apply one operation through the engine's queue: its result, the shape
    its record names (``AllocateOp`` is an ``OpRecord[Allocated]``, and its
    handler builds an ``Allocated``; the runtime's registry holds them all as
    plain dicts, blockpool/runtime/ops/__init__.py)."""
    return cast(R, await engine.submit_op(cast(Op, op)))
