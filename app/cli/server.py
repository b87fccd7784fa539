"""Serving an app with uvicorn until a signal, or the app itself, stops it."""

from __future__ import annotations

import contextlib
from typing import Any


def url_host(host: str) -> str:
    """The bind address as a URL writes it (an IPv6 one in brackets)."""
    return f"[{host}]" if ":" in host else host


class StopRequest:
    """How what runs inside a served app ends its server in order, as a
    signal does (connections closed, the lifespan's shutdown run), without
    one: ``request()`` from the server's event loop; ``run_server`` binds it.
    ``honoured``, once ``run_server`` returned: the server ended because it
    was asked to (not by a signal)."""

    def __init__(self) -> None:
        self.requested = False
        self.honoured = False
        self._server: Any = None

    def request(self) -> None:
        self.requested = True
        if self._server is not None:
            self._server.should_exit = True  # read on the server's next tick

    def bind(self, server: Any) -> None:
        """The server this request ends (one asked for already: at once)."""
        self._server = server
        if self.requested:
            server.should_exit = True


def run_server(
    app: Any,
    host: str,
    port: int,
    log_level: str,
    limits: Any,
    ws_max_size: int = 4096,
    stop: StopRequest | None = None,
) -> int:
    """Serve ``app`` with uvicorn until a signal stops it, or ``stop`` is
    requested (``limits``: the settings' connection limits, app/shared/serving.py)."""
    import uvicorn

    from app.shared.auth import install_log_redaction
    from app.shared.serving import uvicorn_config

    config = uvicorn_config(app, host, port, log_level, limits, ws_max_size)
    install_log_redaction(getattr(limits, "token", None))  # after Config (it configures logging)
    server = uvicorn.Server(config)
    if stop is not None:
        stop.bind(server)
    # Ctrl-C comes back as KeyboardInterrupt after a graceful shutdown:
    # swallowed, as uvicorn.run does (a SIGTERM ends the process there)
    interrupted = True
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
        interrupted = False
    if stop is not None:
        stop.honoured = stop.requested and server.started and not interrupted
    return 0 if server.started else 3  # uvicorn.run's code for a failed start
