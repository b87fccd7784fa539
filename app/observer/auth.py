"""The observer's bearer token (``settings.token``): when one is set, a route
with the ``Auth`` dependency needs ``Authorization: Bearer <token>``; the
websocket checks the same token itself, also taken as ``?token=``
(``observer_app.py``).  The comparison is the service's one (``app.auth``)."""

from __future__ import annotations

from fastapi import Depends, Request

from app.auth import headers_token_ok, token_matches
from app.errors import Unauthorized


def token_ok(given: str | None, token: str) -> bool:
    return token_matches(given, token)


def require_token(request: Request) -> None:
    token: str | None = request.app.state.settings.token
    if token is None or headers_token_ok(request.headers, token):
        return
    raise Unauthorized(
        "this observer needs 'Authorization: Bearer <token>'"
        if not request.headers.get("authorization")
        else "the bearer token is wrong"
    )


Auth = Depends(require_token)
