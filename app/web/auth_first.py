"""The token check before the body is read.

FastAPI reads and parses a route's body before it runs the route's
dependencies, so an unauthenticated 8 MB POST was parsed in full before its
401.  ``AuthBeforeBody`` (an ASGI middleware both apps get from
``app.web.assembly.guard``) runs the matched route's auth checks — the
dependencies listed in ``CHECKS`` — on the headers alone when the app first
asks for the body: a refusal is answered at once, in the one error shape,
without a byte of the body taken.  The route's own dependencies still run after it (the
costly reads' ration, for one, is only taken there).

``CHECKS`` maps a dependency to the check run for it; an app with other
auth dependencies adds its own (``register``).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.shared.errors import OperationError

Check = Callable[[Request], None]
CHECKS: dict[Callable[..., object], Check] = {}


def register(dependency: Callable[..., object], check: Check | None = None) -> None:
    """Run ``check`` (by default the dependency itself, which takes the
    request and raises an OperationError to refuse) before the body is read."""
    CHECKS[dependency] = check or dependency  # type: ignore[assignment]


class RefusedBeforeBody(HTTPException):
    """The check's refusal, raised from the first read of the body: FastAPI
    lets an HTTPException through its body parsing, and the app's handler of
    refusals answers it (``refusal`` is the OperationError)."""

    def __init__(self, refusal: OperationError) -> None:
        super().__init__(401, refusal.message)
        self.refusal = refusal


def _checks_of(route: object) -> list[Check]:
    found = []
    for dep in getattr(route, "dependencies", ()):
        check = CHECKS.get(getattr(dep, "dependency", None))  # type: ignore[arg-type]
        if check is not None:
            found.append(check)
    return found


class AuthBeforeBody:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not CHECKS:
            await self.app(scope, receive, send)
            return
        checked = False

        async def checked_receive() -> Message:
            # The first read of the body comes after routing (the route is in
            # the scope) and before a byte of it is taken.
            nonlocal checked
            if not checked:
                checked = True
                request = Request(scope)
                for check in _checks_of(scope.get("route")):
                    try:
                        check(request)
                    except OperationError as exc:
                        raise RefusedBeforeBody(exc) from None
            return await receive()

        await self.app(scope, checked_receive, send)
