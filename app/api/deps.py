"""Dependencies shared by the routes: the engine, auth, running an operation."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, Request

from app.engine import Engine
from app.errors import Unauthorized


def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


EngineDep = Annotated[Engine, Depends(get_engine)]


def token_given(request: Request, token: str) -> bool:
    """Does the request carry ``Authorization: Bearer <token>``?"""
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    # compare bytes: compare_digest refuses str with non-ASCII characters
    # (a header may carry any latin-1 text), which would be a 500
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def _check_token(request: Request, token: str) -> None:
    if not token_given(request, token):
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


async def run(engine: Engine, op: Any) -> dict[str, Any]:
    """Apply one operation through the engine's queue."""
    return await engine.submit_op(op)
