"""A mirror is read only: every mutating call gets 409 ``read_only_mirror``.

The pool follows the engine's stream alone; a REST allocate, a demo or a
trace would make it another pool.  Lookups that change nothing stay open.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.shared.errors import error_body

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_ONLY_POSTS = frozenset({"/api/pool/prefix-lookup"})
# every answer of a mirror says so (the dashboard shows its mirror item then)
MARK = (b"x-blockpool-mirror", b"1")


class ReadOnlyMirror:
    """ASGI middleware refusing mutations under /api/ (before any body is read),
    and marking every HTTP answer with ``x-blockpool-mirror: 1``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in MUTATING
            and scope["path"].startswith("/api/")
            and scope["path"] not in READ_ONLY_POSTS
        ):
            response = JSONResponse(
                error_body(
                    409,
                    "read_only_mirror",
                    "this service mirrors a vLLM engine: its pool changes only with the "
                    "engine's, never over REST",
                    {"method": scope["method"], "path": scope["path"][:200]},
                ),
                409,
            )
            await response(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), MARK]}
            await send(message)

        await self.app(scope, receive, marked)
