"""Why an operation was refused: typed errors with a stable code and details.

Every refusal is raised before the pool changes, so a refused operation
changed nothing.  The service maps each class to an HTTP status once
(app/api/errors.py); the library knows nothing of HTTP.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Conflict",
    "InvalidInput",
    "NotEnoughBlocks",
    "NotFound",
    "OperationError",
    "ResetRefused",
    "TooLarge",
    "Unavailable",
]


class OperationError(Exception):
    """A refused operation (or query); nothing was changed."""

    code = "bad_request"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        """{"code", "message", "details"}: what a recording keeps of it."""
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidInput(OperationError):
    code = "invalid_input"


class NotFound(OperationError):
    code = "not_found"


class Conflict(OperationError):
    """Well formed, but the pool's state refuses it."""

    code = "conflict"


class NotEnoughBlocks(Conflict):
    code = "not_enough_blocks"


class ResetRefused(Conflict):
    code = "reset_refused"


class TooLarge(OperationError):
    code = "too_large"


class Unavailable(OperationError):
    code = "unavailable"
