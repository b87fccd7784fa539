"""The service's errors: the library's refusals, plus the service's own.

Every 4xx/5xx has one shape (app/api/errors.py maps each class to its HTTP
status, once):

{"error": {"status": 409, "code": "not_enough_blocks",
           "message": "allocate needs 50 free blocks but only 12 are free",
           "details": {"requested": 50, "free": 12}}}
"""

from __future__ import annotations

from typing import Any

# The library's refusals (every one an OperationError, what the service's
# handlers catch), re-exported beside the service's own.
from blockpool.runtime import errors as library_errors
from blockpool.runtime.errors import *  # noqa: F403
from blockpool.runtime.errors import OperationError


class Unauthorized(OperationError):
    code = "unauthorized"


def error_body(
    status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"error": {"status": status, "code": code, "message": message, "details": details or {}}}


__all__ = [*library_errors.__all__, "Unauthorized", "error_body"]
