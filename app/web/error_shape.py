"""One JSON error shape for every 4xx/5xx, and the request-size limit."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.shared.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    OperationError,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_body,
)
from app.web import auth_first

logger = logging.getLogger("blockpool.api")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "body_timeout",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "too_many_requests",
}


# The one mapping from a refusal's class to its HTTP status (most specific first
# through the class's MRO; a class may also carry its own ``status``).
STATUS: dict[type[OperationError], int] = {
    InvalidInput: 422,
    NotFound: 404,
    Conflict: 409,
    TooLarge: 413,
    Unauthorized: 401,
    Unavailable: 503,
}


def status_of(exc: OperationError) -> int:
    for cls in type(exc).__mro__:
        own = cls.__dict__.get("status")
        if isinstance(own, int):
            return own
        status = STATUS.get(cls)
        if status is not None:
            return status
    return 400


def body_of(exc: OperationError) -> dict[str, Any]:
    """The error shape of a refusal."""
    return error_body(status_of(exc), exc.code, exc.message, exc.details)


class ErrorInfo(BaseModel):
    status: int
    code: str
    message: str
    details: dict[str, Any]


class ErrorBody(BaseModel):
    """Every error response has this shape."""

    error: ErrorInfo


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": desc}
    for code, desc in (
        (401, "missing or wrong bearer token"),
        (404, "no such block / request / route"),
        (409, "refused by the pool's state (nothing changed)"),
        (403, "a cross-site request or a foreign Host header (browser pages only)"),
        (413, "over a size limit"),
        (415, "the body is not JSON (Content-Type: application/json)"),
        (422, "invalid input (nothing changed)"),
        (429, "too many costly reads without the token (Retry-After says when)"),
    )
}


def _json(status: int, code: str, message: str, details: dict[str, Any] | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:  # fmt: skip
    return JSONResponse(error_body(status, code, message, details), status, headers=headers)


def _clean(errors: Any) -> list[dict[str, Any]]:
    return [
        {
            "loc": [str(x) for x in e.get("loc", ())],
            "message": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors
    ]


def refusal_response(exc: OperationError) -> JSONResponse:
    """A refusal as its response: its status, the one error shape, and
    ``WWW-Authenticate`` for a 401, ``Retry-After`` for a 429."""
    status = status_of(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status == 429 and "retry_after_s" in exc.details:
        headers = {"Retry-After": str(exc.details["retry_after_s"])}
    return JSONResponse(body_of(exc), status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(OperationError)
    async def _api_error(_: Request, exc: OperationError) -> JSONResponse:
        return refusal_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI reads and parses the body before it runs the route's auth
        # dependency: check the token first, so an unauthorised client is
        # told 401 whatever it sent.
        denied = _auth_denied(request)
        if denied is not None:
            return denied
        raw = exc.errors()
        if any(e.get("loc") == ("body",) and isinstance(e.get("input"), bytes) for e in raw):
            return _json(
                415,
                "unsupported_media_type",
                "the request body must be JSON, sent with 'Content-Type: application/json'",
                {"content_type": request.headers.get("content-type")},
            )
        bad_json = next((e for e in raw if e.get("type") == "json_invalid"), None)
        if bad_json is not None:
            pos = bad_json.get("loc", ("body", "?"))[-1]
            reason = (bad_json.get("ctx") or {}).get("error", "JSON decode error")
            return _json(
                422,
                "invalid_input",
                f"the request body is not valid JSON: {reason} (at character {pos})",
                {"errors": _clean([bad_json]), "error_count": 1},
            )
        errors = _clean(raw)
        first = errors[0] if errors else {"loc": [], "message": "invalid input"}
        where = ".".join(x for x in first["loc"] if x != "body") or "request"
        return _json(
            422,
            "invalid_input",
            f"invalid input at {where}: {first['message']}",
            {"errors": errors[:50], "error_count": len(errors)},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        refusal = getattr(exc, "refusal", None)  # app.web.auth_first: before the body
        if isinstance(refusal, OperationError):
            return refusal_response(refusal)
        if exc.status_code == 400 and exc.detail == _FASTAPI_BODY_ERROR:
            # FastAPI's answer to a JSON body that is not even text (bad UTF-8):
            # the same 422 as any other malformed JSON, after the token check.
            denied = _auth_denied(request)
            if denied is not None:
                return denied
            cause = exc.__cause__
            reason = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
            return _json(
                422,
                "invalid_input",
                f"the request body is not valid JSON: it could not be decoded{reason}"[:300],
                {"errors": [], "error_count": 1},
            )
        code = _CODES.get(exc.status_code, "error")
        message = str(exc.detail) if exc.detail else code.replace("_", " ")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), **_allow(request)}
        return _json(exc.status_code, code, message, getattr(exc, "details", None), headers)

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return _json(500, "internal_error", f"internal error: {type(exc).__name__}: {exc}")


_FASTAPI_BODY_ERROR = "There was an error parsing the body"


def _allow(request: Request) -> dict[str, str]:
    """``Allow`` for a 405: every method of the path (Starlette names only
    those of the first route that matched the path, e.g. POST but not GET
    for /api/requests)."""
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            methods.update(m.upper() for m in operations)
    if not methods:
        return {}
    if "GET" in methods:
        methods.add("HEAD")
    return {"Allow": ", ".join(sorted(methods))}


def _auth_denied(request: Request) -> JSONResponse | None:
    """The 401 response when the matched route's auth dependency refuses
    (the checks the apps registered with ``auth_first``: a costly read's
    ration is not taken here)."""
    route = request.scope.get("route")
    for dep in getattr(route, "dependencies", ()):
        check = auth_first.CHECKS.get(dep.dependency)
        if check is not None:
            try:
                check(request)
            except OperationError as exc:
                return JSONResponse(
                    body_of(exc), status_of(exc), headers={"WWW-Authenticate": "Bearer"}
                )
    return None


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 (declared or streamed)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limit or declared < 0:
                    await self._refuse(scope, receive, send, declared)
                    return
        seen = 0
        limit = self.limit

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(seen, limit)
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge as exc:
            await self._refuse(scope, receive, send, exc.size)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        response = _json(
            413,
            "too_large",
            f"the request body is over the limit of {self.limit} bytes",
            {"limit": self.limit, "size": size},
        )
        await response(scope, receive, send)


class _TooLarge(HTTPException):
    """Raised while the body streams in; FastAPI re-raises HTTPExceptions."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(413, f"the request body is over the limit of {limit} bytes")
        self.size = size
        self.details = {"limit": limit, "size_so_far": size}
