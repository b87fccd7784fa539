"""Serving an app with uvicorn until a signal stops it."""

from __future__ import annotations

import contextlib
from typing import Any


def url_host(host: str) -> str:
    """The bind address as a URL writes it (an IPv6 one in brackets)."""
    return f"[{host}]" if ":" in host else host


def run_server(
    app: Any, host: str, port: int, log_level: str, limits: Any, ws_max_size: int = 4096
) -> int:
    """Serve ``app`` with uvicorn until a signal stops it (``limits``: the
    settings' connection limits, app/core/serving.py)."""
    import uvicorn

    from app.core.auth import install_log_redaction
    from app.core.serving import uvicorn_config

    config = uvicorn_config(app, host, port, log_level, limits, ws_max_size)
    install_log_redaction(getattr(limits, "token", None))  # after Config (it configures logging)
    server = uvicorn.Server(config)
    # Ctrl-C comes back as KeyboardInterrupt after a graceful shutdown:
    # swallowed, as uvicorn.run does
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 3  # uvicorn.run's code for a failed start
