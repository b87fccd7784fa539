"""Why an operation was refused: typed errors with a stable code and details.

Every refusal is raised before the pool changes, so a refused operation
changed nothing.  The service maps each class to an HTTP status once
(app/web/error_shape.py); the library knows nothing of HTTP.

Shared name: ``errors`` is each layer's own exceptions (blockpool/core:
vLLM's assertions, blockpool/runtime: an operation's refusals, app/shared:
the service's, on the runtime's); app/web/error_shape.py maps them to HTTP.
"""

from __future__ import annotations

import re
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
    """A refused operation (or query); nothing was changed.

    Each subclass's ``code`` (the stable code the service reports) is its
    name in snake case (``NotEnoughBlocks``: ``not_enough_blocks``) unless
    it sets its own."""

    code = "bad_request"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            cls.code = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        """{"code", "message", "details"}: what a recording keeps of it."""
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidInput(OperationError):
    """Malformed: a field out of range, a wrong length, ids outside the pool."""


class NotFound(OperationError):
    """No such request (or other named thing)."""


class Conflict(OperationError):
    """Well formed, but the pool's state refuses it."""


class NotEnoughBlocks(Conflict):
    """Too few free blocks for the allocation."""


class ResetRefused(Conflict):
    """A reset while blocks are still held."""


class TooLarge(OperationError):
    """Over one of the runtime's size limits (ids per call, tokens, requests)."""


class Unavailable(OperationError):
    """The runtime cannot answer now (a feature that is off)."""
