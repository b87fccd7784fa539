"""Browser tests: a REAL server (uvicorn in a subprocess) and headless Chromium.

Chromium is Debian's /usr/bin/chromium driven by Playwright (``playwright
install`` cannot download browsers here).  These tests never skip: when
Chromium or the server cannot run, they fail.  Screenshots go to
test-artifacts/e2e/ (git-ignored).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chromium import CHROMIUM, CHROMIUM_ARGS, require_chromium
from tests.e2e import hooks
from tests.support.cli import wait_healthy
from tests.support.ports import free_port
from tests.support.wait import CLIENT_KEEPALIVE_S, CLIENT_TIMEOUT, eventually

__all__ = ["free_port", "wait_for"]  # the e2e tests import them from here
# a page's predicate asks the browser: every 0.1 s is often enough
wait_for = functools.partial(eventually, poll=0.1)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "e2e"
VIEWPORT = {"width": 1600, "height": 1000}


class Server:
    """``python -m app.cli serve`` on a port, with its log in test-artifacts."""

    def __init__(self, port: int, *args: str, name: str = "server") -> None:
        self.port = port
        self.args = list(args)
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(
            base_url=self.url,
            timeout=CLIENT_TIMEOUT,
            limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S),
        )
        self.token: str | None = None
        self._log: Any = None
        self.starts = 0

    def start(self, *args: str) -> Server:
        if args:
            self.args = list(args)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self._log = open(ARTIFACTS / f"{self.name}-{self.starts}.log", "wb")  # noqa: SIM115
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), *self.args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKPOOL_")}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=self._log)
        try:
            wait_healthy(self.proc, self.url, Path(self._log.name))
        except AssertionError:
            self.stop()
            raise
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        self.stop()
        self.http.close()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str) -> Any:
        r = self.http.get(path, headers=self._headers())
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return self.http.post(path, json={} if body is None else body, headers=self._headers())


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    # Package scope, not session: Playwright's sync API keeps an asyncio loop
    # marked running in this thread while it is open, and later packages'
    # asyncio.run() would refuse to start.
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@contextlib.contextmanager
def running(name: str, *args: str) -> Iterator[Server]:
    """``blockpool serve ARGS`` on a free port for a block of tests; closed after."""
    srv = Server(free_port(), *args, name=name)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running("server", "--num-blocks", "4096", "--demo", "--log-level", "warning") as srv:
        yield srv


class Page:
    """A dashboard tab with its console errors collected."""

    def __init__(
        self,
        browser: Any,
        url: str,
        name: str,
        viewport: dict[str, int] | None = None,
        init_script: str | None = None,
    ) -> None:
        self.ctx = browser.new_context(viewport=viewport or VIEWPORT)
        if init_script:  # a test's own recorder, in place before the page's scripts
            self.ctx.add_init_script(script=init_script)
        hooks.install(self.ctx)  # window.__bp (the page itself sets no globals)
        # every URL the page asks for (the websocket too): none may leave the server
        self.requests: list[str] = []
        self.ctx.on("request", lambda r: self.requests.append(r.url))
        self.page = self.ctx.new_page()
        self.page.on("websocket", lambda ws: self.requests.append(ws.url))
        self.name = name
        self.errors: list[str] = []  # page errors and console.error
        # the browser's own network lines: HTTP errors, refused connections
        self.network: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.goto(url + "/")
        try:
            self.page.wait_for_function("() => window.__bp && window.__bp.ready()", timeout=120_000)
        except Exception as exc:
            state = self.page.evaluate(
                "() => window.__bp ? {health: window.__bp.conn.health, seq: window.__bp.model.seq,"
                " n: window.__bp.model.n, map: window.__bp.map.n} : 'no __bp'"
            )
            raise AssertionError(
                f"the dashboard did not get ready: {state}; errors {self.errors}"
            ) from exc

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            if msg.text.startswith(("Failed to load resource", "WebSocket connection to")):
                self.network.append(msg.text)
            else:
                self.errors.append(f"console: {msg.text}")

    def js(self, expr: str, arg: Any = None) -> Any:
        return self.page.evaluate(expr, arg)

    def frames(self, n: int = 2) -> None:
        """Wait until the page has drawn ``n`` more animation frames (the
        canvas is repainted in a frame, not when its source changes)."""
        start = self.js("() => window.__bp.perf.raf")
        self.page.wait_for_function("(r) => window.__bp.perf.raf >= r", arg=start + n)

    def shot(self, suffix: str = "") -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{self.name}{suffix}.png"
        # a sticky top bar would be painted mid-page in a full-page capture
        self.page.evaluate("() => document.querySelector('.topbar').style.position = 'static'")
        self.page.screenshot(path=str(path), full_page=True)
        self.page.evaluate("() => document.querySelector('.topbar').style.position = ''")
        return path

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture(scope="module")
def mirror() -> Iterator[Any]:
    """A dashboard on a mirror told of client requests, one a module (the
    mirror page tests: tests/e2e/mirror_page.py, ``told_mirror``)."""
    from tests.e2e.mirror_page import told_mirror  # (it imports this module)

    with told_mirror() as m:
        yield m


@pytest.fixture
def dashboard(browser: Any, server: Server, request: pytest.FixtureRequest) -> Iterator[Page]:
    page = Page(browser, server.url, request.node.name)
    yield page
    page.shot()
    page.close()
