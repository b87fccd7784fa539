"""``blockpool serve --mirror`` as a real process: an engine restarted as
another pool makes it rebuild its whole service from the new handshake, in
the same process, on the same port; /api/config then shows the new size and
the mirror is exact again, counting the rebuild."""

from __future__ import annotations

import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import websockets.sync.client

from blockpool.mirror.auth import StreamKey
from tests.mirror.rig import Rig, metric
from tests.support.cli import ROOT, cli_env, stop_cli_server, wait_healthy
from tests.support.ports import free_port
from tests.support.wait import CLIENT_KEEPALIVE_S, CLIENT_TIMEOUT, eventually

SECRET = "the engine's secret, 32 chars ok"
WAIT_S = 180.0  # a bound for a stuck wait on a loaded machine, not a timing check


def serve_mirror(rig: Rig, port: int, secret: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "app.cli", "serve", "--mirror", rig.endpoint,
        "--mirror-token-file", str(secret), "--mirror-wait", "120", "--port", str(port),
        "--log-level", "info",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=cli_env(), stdout=out, stderr=subprocess.STDOUT)
    wait_healthy(proc, f"http://127.0.0.1:{port}", log)
    return proc


def test_serve_mirror_rebuilds_its_service_when_the_engine_restarts_as_another_pool(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "mirror.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    rig = Rig("uncached_first", key=StreamKey(SECRET.encode()), num_blocks=64)
    rig.start()
    port = free_port()
    log = tmp_path / "serve.log"
    proc = serve_mirror(rig, port, secret, log)
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=CLIENT_TIMEOUT,
            limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S),
        ) as http:

            def exact_as(blocks: int) -> dict[str, Any] | None:
                """/api/mirror once it says exact for an engine of ``blocks``
                (the engine driven meanwhile; None while the server rebuilds)."""
                assert proc.poll() is None, "serve exited:\n" + log.read_text()
                rig.engine.drive(1)
                try:
                    st: dict[str, Any] = http.get("/api/mirror").json()
                except (httpx.TransportError, ValueError):
                    return None
                engine = st.get("engine") or {}
                return st if st["exact"] and engine.get("num_gpu_blocks") == blocks else None

            first = eventually(
                lambda: exact_as(64), WAIT_S, "the mirror exact at 64 blocks", poll=0.1
            )
            assert first["rebuilds"] == 0 and first["engine_restarts"] == 0
            assert http.get("/api/config").json()["num_blocks"] == 64

            # a dashboard's live stream stays open (never read) across the rebuild
            stream = ExitStack()
            stream.enter_context(
                websockets.sync.client.connect(f"ws://127.0.0.1:{port}/api/stream", open_timeout=60)
            )
            rig.restart(num_blocks=96)
            st = eventually(lambda: exact_as(96), WAIT_S, "the mirror exact at 96 blocks", poll=0.1)
            assert st["rebuilds"] == 1 and st["state"] == "exact" and st["problem"] is None
            assert http.get("/api/config").json()["num_blocks"] == 96
            assert metric(http.get("/metrics").text, "blockpool_mirror_rebuilds_total") == 1
            stream.close()
        assert proc.poll() is None  # the same process all along
    finally:
        stop_cli_server(proc)
        rig.close()
    out = log.read_text()
    assert "the engine restarted as 96 blocks of" in out and "(was 64): rebuilding" in out, out
    assert out.count("Application startup complete.") == 2, out
    assert "Traceback" not in out, out
