"""The service's errors: one shape for every 4xx/5xx.

{"error": {"status": 409, "code": "not_enough_blocks",
           "message": "allocate needs 50 free blocks but only 12 are free",
           "details": {"requested": 50, "free": 12}}}
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error a client caused (or a refusal); nothing was changed."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.code, self.message, self.details)


def error_body(
    status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"error": {"status": status, "code": code, "message": message, "details": details or {}}}


class InvalidInput(ApiError):
    status = 422
    code = "invalid_input"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    """The request is well formed but the pool's state refuses it."""

    status = 409
    code = "conflict"


class NotEnoughBlocks(Conflict):
    code = "not_enough_blocks"


class ResetRefused(Conflict):
    code = "reset_refused"


class TooLarge(ApiError):
    status = 413
    code = "too_large"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"


class Unavailable(ApiError):
    status = 503
    code = "unavailable"
