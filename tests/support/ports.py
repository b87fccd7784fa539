"""Free local ports (bound on 127.0.0.1, as every server of the suite is)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tcp_endpoint() -> str:
    """A ZMQ endpoint on a free local port."""
    return f"tcp://127.0.0.1:{free_port()}"
