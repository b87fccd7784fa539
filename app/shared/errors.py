"""The service's errors: the library's refusals, plus the service's own.

Every 4xx/5xx has one shape (app/web/error_shape.py maps each class to its HTTP
status, once):

{"error": {"status": 409, "code": "not_enough_blocks",
           "message": "allocate needs 50 free blocks but only 12 are free",
           "details": {"requested": 50, "free": 12}}}

Shared name: ``errors`` is each layer's own exceptions (blockpool/core:
vLLM's assertions, blockpool/runtime: an operation's refusals, app/shared:
the service's, on the runtime's); app/web/error_shape.py maps them to HTTP.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

# The library's refusals (every one an OperationError, what the service's
# handlers catch), re-exported beside the service's own.
from blockpool.runtime import errors as library_errors
from blockpool.runtime.errors import *  # noqa: F403
from blockpool.runtime.errors import OperationError

if TYPE_CHECKING:
    from starlette.types import Send


class Unauthorized(OperationError):
    code = "unauthorized"


def error_body(
    status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"error": {"status": status, "code": code, "message": message, "details": details or {}}}


async def send_error(
    send: Send,
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    close: bool = False,
) -> None:
    """Answer in the one error shape straight from ASGI middleware; ``close``
    asks the client to drop the connection."""
    body = json.dumps(error_body(status, code, message, details)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = [*library_errors.__all__, "Unauthorized", "error_body", "send_error"]
