"""The dashboard on a server that protects reads: the stream connects with
the token in ``Sec-WebSocket-Protocol`` (the server echoes ``blockpool``),
the websocket URL holds no token, and no token reaches the server's log.
(Only the page's network is observed: no test hooks needed.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.stream import protocol as p
from tests.chromium import CHROMIUM, CHROMIUM_ARGS, require_chromium
from tests.support.cli import start_cli_server, stop_cli_server
from tests.support.ports import free_port

pytestmark = pytest.mark.browser

TOKEN = "br0wser-T0ken-77"


def test_the_dashboard_streams_with_the_token_outside_the_url(tmp_path: Path) -> None:
    require_chromium()
    from playwright.sync_api import sync_playwright

    port = free_port()
    log = tmp_path / "server.log"
    proc = start_cli_server(port, log, "--token", TOKEN, env={"BLOCKPOOL_PROTECT_READS": "1"})
    sockets: list[str] = []
    frames: list[bytes] = []
    closed: list[str] = []
    errors: list[str] = []

    def on_socket(ws: Any) -> None:
        sockets.append(ws.url)
        ws.on("framereceived", lambda data: isinstance(data, bytes) and frames.append(data))
        ws.on("close", lambda _ws: closed.append(ws.url))

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"http://127.0.0.1:{port}/")
                page.evaluate(f"() => sessionStorage.setItem('blockpool.token', {TOKEN!r})")
                page.on("websocket", on_socket)
                page.reload()
                # config, then the snapshot: the stream took the token (a
                # refused one is closed with 4401 before any frame); Chromium
                # fails a handshake whose offered subprotocol is not echoed
                for _ in range(1200):  # bounded wait on a condition
                    if len(frames) >= 2:
                        break
                    page.wait_for_timeout(50)
                kinds = [p.decode(f).kind for f in frames[:2]]
                assert kinds == [p.CONFIG, p.SNAPSHOT], (kinds, closed, errors)
                assert not closed, closed
            finally:
                browser.close()
    finally:
        stop_cli_server(proc)
    assert sockets and all("/api/stream" in u and TOKEN not in u for u in sockets), sockets
    assert errors == [], errors
    text = log.read_text("utf-8", "replace")
    assert '"WebSocket /api/stream' in text and "[accepted]" in text, text[-2000:]
    assert TOKEN not in text and "Traceback" not in text, text[-2000:]
