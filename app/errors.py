"""The service's errors: the library's refusals, plus the service's own.

Every 4xx/5xx has one shape (app/api/errors.py maps each class to its HTTP
status, once):

{"error": {"status": 409, "code": "not_enough_blocks",
           "message": "allocate needs 50 free blocks but only 12 are free",
           "details": {"requested": 50, "free": 12}}}
"""

from __future__ import annotations

from typing import Any

from blockpool.runtime.errors import (
    Conflict,
    InvalidInput,
    NotEnoughBlocks,
    NotFound,
    OperationError,
    ResetRefused,
    TooLarge,
    Unavailable,
)

# What the service's handlers catch: every refusal, the library's and its own.
ApiError = OperationError


class Unauthorized(OperationError):
    code = "unauthorized"


def error_body(
    status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"error": {"status": status, "code": code, "message": message, "details": details or {}}}


__all__ = [
    "ApiError",
    "Conflict",
    "InvalidInput",
    "NotEnoughBlocks",
    "NotFound",
    "ResetRefused",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "error_body",
]
