"""The command line of this checkout in a child process: one-shot commands
and a ``blockpool serve`` that is ready once /api/health answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.wait import CLIENT_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120.0  # a bound for a stuck start, not a timing check


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: this checkout first on the path, no
    BLOCKPOOL_* settings leaking in from the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKPOOL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **(extra or {})}


def run_cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``blockpool ARGS`` run to its end, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_tool(
    cmd: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> str:
    """Another program of the suite (node, npx, a vLLM environment's python)
    run to its end: its output, stdout then stderr; fails with the output's
    tail when it exits non-zero."""
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{Path(cmd[0]).name} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Until ``url``/api/health answers 200; fails when the child exits first."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited during its start:\n" + log.read_text()
        try:
            if httpx.get(f"{url}/api/health", timeout=CLIENT_TIMEOUT).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise AssertionError(f"the server never answered {url}/api/health (log: {log})")


def start_cli_server(
    port: int, log: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``blockpool serve`` of this checkout in a child process, stdout and
    stderr (its whole log) into ``log``; ready once ``/api/health`` answers."""
    cmd = [
        sys.executable, "-c", "from app.cli import main; main()", "serve", "--port", str(port),
        "--num-blocks", "64", "--no-storage", "--no-analysis", "--log-level", "info", *args,
    ]  # fmt: skip
    return _start_child(cmd, port, log, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def start_cli_observer(
    port: int, log: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``blockpool observe ARGS`` (its sources: ``name=endpoint``, options)
    of this checkout in a child process, no BLOCKPOOL_* settings but ``env``'s,
    its whole log into ``log``; ready once ``/api/health`` answers (its
    sources may still be connecting)."""
    cmd = [sys.executable, "-m", "app.cli", "observe", "--port", str(port), *args]
    return _start_child(cmd, port, log, cli_env(env))


def _start_child(
    cmd: list[str], port: int, log: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_healthy(proc, f"http://127.0.0.1:{port}", log)
    return proc


def stop_cli_server(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as an operator stops it."""
    proc.send_signal(2)  # SIGINT
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
