"""No secret in a log line, at any level, in any spelling.

``blockpool serve --log-level debug`` logs every websocket handshake header
and URL (uvicorn's and websockets' debug lines).  A client presenting the
token every way the server accepts it — ``Authorization``, the ``bearer.`` /
``base64url.bearer.`` subprotocols, a ticket, ``?token=`` spelled
``?tok%65n=`` or ``?TOKEN=`` — leaves none of it in the output.  The token
is passed the recommended way (``--token-file``); ``--token`` still works
and is warned about."""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from uvicorn.logging import AccessFormatter

from app.cli import main, parser
from app.shared import auth
from tests.app.conftest import free_port
from tests.app.test_cli import assert_clean_exit, serve, stop, wait_healthy

TOKEN = "Zq7-log-secret-~x"


def test_every_spelling_is_redacted_and_redaction_is_idempotent() -> None:
    b64 = base64.urlsafe_b64encode(TOKEN.encode()).decode().rstrip("=")
    lines = [
        f"< GET /api/stream?tok%65n={TOKEN} HTTP/1.1",
        f"< GET /api/stream?TOKEN={TOKEN}&x=1 HTTP/1.1",
        f"< GET /api/stream?%54icket={TOKEN} HTTP/1.1",
        f"< authorization: Bearer {TOKEN}",
        f"< Proxy-Authorization: Basic {TOKEN}",
        f"< sec-websocket-protocol: blockpool, bearer.{TOKEN}",
        f"< sec-websocket-protocol: base64url.bearer.{b64}, blockpool",
        f"< sec-websocket-protocol: ticket.{TOKEN}",
        f"header was 'Bearer {TOKEN}'",
    ]
    for line in lines:
        once = auth.redact(line)
        assert TOKEN not in once and b64 not in once and auth.REDACTED in once, once
        assert auth.redact(once) == once
    assert auth.redact("GET /x?tokens=1&ticketed=2") == "GET /x?tokens=1&ticketed=2"
    # a known token is blanked wherever it shows, percent-encoded too
    auth.install_log_redaction(TOKEN)
    assert TOKEN not in auth.redact(f"odd place: {TOKEN}")
    assert "Zq7-log-secret-%7Ex" not in auth.redact("q=Zq7-log-secret-%7Ex")


def test_the_filter_keeps_formatters_that_read_the_arguments_working() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", f"/api/stream?tok%65n={TOKEN}", "1.1", 200), None,
    )  # fmt: skip
    assert auth.RedactSecrets().filter(record)
    shown = AccessFormatter("%(message)s", use_colors=False).format(record)
    assert TOKEN not in shown and "tok%65n=[redacted]" in shown and "200" in shown


def test_redaction_reaches_every_handler_and_child_logger(
    caplog: pytest.LogCaptureFixture,  # noqa: ARG001 fixture captures the output
) -> None:
    auth.install_log_redaction()
    handler = logging.getLogger().handlers[-1] if logging.getLogger().handlers else None
    assert handler is not None and any(isinstance(f, auth.RedactSecrets) for f in handler.filters)
    for name in auth.LOGGERS:
        log = logging.getLogger(name)
        assert sum(isinstance(f, auth.RedactSecrets) for f in log.filters) == 1
        assert all(
            sum(isinstance(f, auth.RedactSecrets) for f in h.filters) == 1 for h in log.handlers
        )


async def _probe(port: int, token: str, ticket: str) -> list[str]:
    b64 = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
    url = f"ws://127.0.0.1:{port}/api/stream"
    attempts: list[tuple[str, dict[str, Any]]] = [
        (url, {"subprotocols": ["blockpool", f"bearer.{token}"]}),
        (url, {"subprotocols": ["blockpool", f"base64url.bearer.{b64}"]}),
        (url, {"subprotocols": ["blockpool", f"ticket.{ticket}"]}),
        (url, {"additional_headers": {"Authorization": f"Bearer {token}"}}),
        (f"{url}?tok%65n={token}", {}),
        (f"{url}?TOKEN={token}", {}),
    ]
    outcomes = []
    for target, kw in attempts:
        async with websockets.connect(target, open_timeout=30, **kw) as ws:  # type: ignore[arg-type]
            await ws.recv()
            outcomes.append("open")
    return outcomes


def test_a_debug_log_holds_no_secret(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(
        "--port", str(port), "--num-blocks", "64", "--no-demo", "--log-level", "debug",
        "--token-file", str(token_file),
    )  # fmt: skip
    try:
        wait_healthy(proc, url)
        good = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, timeout=30) as c:
            assert c.post("/api/pool/allocate", json={"num_blocks": 1}, headers=good).is_success
            r = c.post("/api/pool/allocate", json={"num_blocks": 1})
            assert r.status_code == 401  # the file's token is the token
            ticket = c.post("/api/stream/ticket", headers=good).json()["ticket"]
            assert c.get(f"/api/summary?tok%65n={TOKEN}").status_code == 200
        assert asyncio.run(_probe(port, TOKEN, ticket)) == ["open"] * 6
    finally:
        out = stop(proc)
    assert_clean_exit(proc, out)
    assert "< sec-websocket-protocol" in out  # the debug lines are there ...
    b64 = base64.urlsafe_b64encode(TOKEN.encode()).decode().rstrip("=")
    for secret in (TOKEN, b64, ticket, "Zq7-log-secret-%7Ex"):
        assert secret not in out, secret  # ... without a secret
    assert "given with --token" not in out


def test_the_token_flag_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ARG001 fixture captures the output
    port = free_port()
    proc = serve("--port", str(port), "--num-blocks", "64", "--no-demo", "--token", TOKEN)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}")
    finally:
        out = stop(proc)
    assert "given with --token" in out and "--token-file" in out and TOKEN not in out
    for command in ("serve", "observe"):
        sub = parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        text = "".join(sub.format_help().split())  # (argparse wraps at hyphens too)
        assert "--token-filePATH" in text and "prefer--token-fileorBLOCKPOOL_TOKEN" in text


def test_a_bad_token_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--token-file", str(tmp_path / "missing")]) == 2
    assert "--token-file" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert main(["observe", "tcp://127.0.0.1:1", "--token-file", str(empty)]) == 2
    assert "line 1 is empty" in capsys.readouterr().err
