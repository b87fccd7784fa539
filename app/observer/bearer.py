"""The observer's bearer token (``settings.token``): when one is set, a route
with the ``Auth`` dependency needs ``Authorization: Bearer <token>``; the
websocket checks the same token itself, also taken as ``?token=``
(``observer_app.py``).  The comparison is the service's one (``app.shared.auth``)."""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.shared.auth import headers_token_ok, token_matches
from app.shared.errors import Unauthorized, error_body

OPEN_PATHS = ("/api/health",)  # what needs no token (besides the page, its files and /docs)


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


class TokenGate:
    """The token check before anything reads the request: with a token set,
    an HTTP request to ``/api/...`` (but ``/api/health``) or ``/metrics``
    without it gets its 401 here, its body never read (the route's ``Auth``
    dependency would only run after FastAPI has read and parsed the body)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = self.token
        if token is None or scope["type"] != "http" or not _guarded(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if headers_token_ok(headers, token):
            await self.app(scope, receive, send)
            return
        message = (
            "the bearer token is wrong"
            if headers.get("authorization")
            else "this observer needs 'Authorization: Bearer <token>'"
        )
        response = JSONResponse(
            error_body(401, "unauthorized", message),
            401,
            headers={"WWW-Authenticate": "Bearer", "Connection": "close"},
        )
        await response(scope, receive, send)


def _guarded(path: str) -> bool:
    return (path.startswith("/api/") and path not in OPEN_PATHS) or path == "/metrics"
