"""Typed errors.

Where vLLM asserts, ours subclass AssertionError too, so code written against
vLLM that expects an assertion still sees one.

Shared name: ``errors`` is each layer's own exceptions (blockpool/core:
vLLM's assertions, blockpool/runtime: an operation's refusals, app/shared:
the service's, on the runtime's); app/web/error_shape.py maps them to HTTP.
"""

from __future__ import annotations


class BlockPoolError(Exception):
    """Base of every error blockpool raises on purpose."""


class PoolAssertionError(BlockPoolError, AssertionError):
    """A precondition vLLM guards with an assertion."""


class StrictModeError(BlockPoolError, ValueError):
    """Strict mode refused an operation before changing anything."""


class UnknownBlockError(StrictModeError):
    """A block id outside the pool, or a block object of another pool."""


class NullBlockError(StrictModeError):
    """An operation that must never touch the null block was given it."""


class DoubleFreeError(StrictModeError):
    """Freeing a block more times than it is held."""


class ManagerError(BlockPoolError):
    """Base of the request-level manager's errors."""


class UnknownRequestError(ManagerError, KeyError):
    """No running request has this id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown request"


class DuplicateRequestError(ManagerError, ValueError):
    """A request with this id is already running."""


class RequestFinishedError(ManagerError, ValueError):
    """The request was already finished."""


class NotEnoughBlocksError(ManagerError, ValueError):
    """Too few free blocks; nothing was changed."""

    def __init__(self, message: str, requested: int, free: int) -> None:
        super().__init__(message)
        self.requested = requested
        self.free = free
