"""A loopback PEP 503 index of local wheels, for builds on machines whose
torch index (PyTorch's) is not reachable: pip inside ``docker build
--network host`` reads it at http://127.0.0.1:PORT/simple/."""

from __future__ import annotations

import functools
import http.server
import os
import re
import tempfile
import threading
from pathlib import Path

from scripts.demo_check.phases import say


def local_wheels(pattern: str) -> list[Path]:
    """Wheels matching ``pattern`` in pip's ``PIP_FIND_LINKS`` folders."""
    out = []
    for d in os.environ.get("PIP_FIND_LINKS", "").split():
        folder = Path(d.removeprefix("file://"))
        if folder.is_dir():
            out += sorted(folder.glob(pattern))
    return out


PORT = 35629


class WheelIndex:
    """Serves ``wheels`` as a simple index until ``close``."""

    def __init__(self, wheels: list[Path]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="demo-check-index-")
        root = Path(self._dir.name)
        for w in wheels:
            project = re.sub(r"[-_.]+", "-", w.name.split("-", 1)[0]).lower()
            (root / "simple" / project).mkdir(parents=True, exist_ok=True)
            (root / "simple" / project / w.name).symlink_to(w.resolve())
        handler = functools.partial(_Quiet, directory=str(root))
        try:  # the same URL every run: it is a build arg, part of the layers' cache key
            self._server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), handler)
        except OSError:
            self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/simple"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        say(f"local wheel index {self.url}: {', '.join(w.name for w in wheels)}")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._dir.cleanup()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass
