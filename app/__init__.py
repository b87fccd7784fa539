"""The blockpool service: FastAPI + uvicorn around one engine that owns the pool.

``main`` is the ``blockpool`` command.  The service's packages come with the
``service`` extra; a plain ``pip install blockpool`` has the library only,
and the command then says which extra to install instead of a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# what the ``service`` extra installs (import names)
SERVICE_PACKAGES = frozenset(
    {
        "fastapi",
        "starlette",
        "uvicorn",
        "pydantic",
        "pydantic_settings",
        "prometheus_client",
        "zmq",
        "msgpack",
        "websockets",
        "httpx",
    }
)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``blockpool`` command (``app.cli.main``), or exit 2 naming the
    extra to install when a package of the service is missing."""
    try:
        from app.cli import main as cli_main
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in SERVICE_PACKAGES:
            raise
        print(  # noqa: T201 the command's own error message
            f"blockpool: the command needs the service extra ({missing} is not installed):\n"
            "  pip install 'blockpool[service]'",
            file=sys.stderr,
        )
        return 2
    return cli_main(argv)
