"""The observer's bearer token (``settings.token``): when one is set, a route
with the ``Auth`` dependency needs ``Authorization: Bearer <token>``; the
websocket checks the same token itself, also taken as ``?token=``
(``observer_app.py``)."""

from __future__ import annotations

import hmac

from fastapi import Depends, Request

from app.errors import Unauthorized


def token_ok(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.strip().encode(), token.encode())


def require_token(request: Request) -> None:
    token: str | None = request.app.state.settings.token
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() == "bearer" and token_ok(given, token):
        return
    raise Unauthorized(
        "this observer needs 'Authorization: Bearer <token>'"
        if not header
        else "the bearer token is wrong"
    )


Auth = Depends(require_token)
