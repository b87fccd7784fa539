"""What both apps — the pool service (``app.main``) and the observer
(``app.observer.app``) — are assembled from, so that they answer alike:

- ``new_app``: FastAPI with the one JSON error shape and ``/docs`` served
  from the package (no CDN), the generated ReDoc off;
- ``serve_page``: the page at ``/`` and its files under ``/static``, when
  the frontend is installed (the API serves either way);
- ``guard``: the same-origin guard (added last so it runs first), then the
  token check on the headers before any body is read
  (``app.web.auth_first``), then the body deadline
  (``app.shared.serving.BodyDeadline``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

import blockpool
from app.shared.serving import DEFAULT_BODY_TIMEOUT_S, BodyDeadline
from app.web import docs as api_docs
from app.web import error_shape as api_errors
from app.web.auth_first import AuthBeforeBody
from app.web.same_origin import SameOriginGuard

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def new_app(title: str, summary: str, lifespan: Lifespan, **state: Any) -> FastAPI:
    """The app with the project's error shape and offline docs; ``state``
    goes on ``app.state`` (its settings and services)."""
    app = FastAPI(
        title=title,
        version=blockpool.__version__,
        summary=summary,
        lifespan=lifespan,
        docs_url=None,  # app.web.docs serves /docs from the package
        redoc_url=None,
    )
    api_errors.install(app)
    api_docs.install(app)
    for name, value in state.items():
        setattr(app.state, name, value)
    return app


def serve_page(app: FastAPI, folder: Path, page: str) -> None:
    """``folder/page`` at ``/`` and ``folder`` under ``/static``, if present."""
    if not (folder / page).is_file():
        return
    app.mount("/static", StaticFiles(directory=folder), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(folder / page)


def limit_bodies(app: FastAPI, limit: int) -> None:
    """Bodies over ``limit`` bytes get 413, declared or streamed (both apps)."""
    app.add_middleware(api_errors.BodyLimit, limit=limit)


def guard(
    app: FastAPI, bind_host: str, allowed_hosts: Iterable[str], allowed_origins: Iterable[str]
) -> None:
    """Outermost (call it last): cross-site and foreign-Host requests are
    refused before anything else runs; then a body that trickles in is cut
    off after the settings' ``body_timeout_s``."""
    settings = getattr(app.state, "settings", None)
    timeout_s = getattr(settings, "body_timeout_s", DEFAULT_BODY_TIMEOUT_S)
    app.add_middleware(BodyDeadline, timeout_s=timeout_s)
    app.add_middleware(AuthBeforeBody)
    app.add_middleware(
        SameOriginGuard,
        bind_host=bind_host,
        allowed_hosts=allowed_hosts,
        allowed_origins=allowed_origins,
    )


__all__ = ["Lifespan", "guard", "new_app", "serve_page"]
