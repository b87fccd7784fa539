"""`blockpool serve` as a real process: starts, logs its config and URL,
serves, stops on SIGTERM; invalid flags exit with status 2 and a message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.cli import main, parser
from app.cli.commands import describe
from app.cli.settings import settings_from
from tests.app.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKPOOL_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def serve(*flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", *flags],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_healthy(proc: subprocess.Popen[str], url: str, timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"server exited with {proc.returncode}:\n{out}")
        try:
            r = httpx.get(f"{url}/api/health", timeout=1)
            if r.status_code == 200:
                return r.json()  # type: ignore[no-any-return]
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not become healthy"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"server did not stop on SIGTERM:\n{out}") from None
    return out


def assert_clean_exit(proc: subprocess.Popen[str], out: str) -> None:
    # uvicorn shuts down gracefully, then re-raises the signal it caught, so
    # the process ends "killed by SIGTERM" after a clean shutdown
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "Application shutdown complete." in out, out
    assert "Traceback" not in out, out


def test_serve_starts_logs_and_stops() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve("--port", str(port), "--num-blocks", "128", "--no-demo", "--block-size", "8")
    try:
        health = wait_healthy(proc, url)
        assert health == {"status": "ok", "num_blocks": 128}
        cfg = httpx.get(f"{url}/api/config").json()
        assert cfg["num_blocks"] == 128 and cfg["block_size"] == 8
        r = httpx.post(f"{url}/api/pool/allocate", json={"num_blocks": 3})
        assert r.json()["block_ids"] == [1, 2, 3]
        demo = httpx.get(f"{url}/api/demo").json()
        assert demo["running"] is False
    finally:
        out = stop(proc)
    assert_clean_exit(proc, out)
    assert "pool: 128 blocks x 8 tokens, 1 group(s), hash sha256, caching on" in out, out
    assert "demo off" in out and "auth off" in out
    assert f"dashboard: http://127.0.0.1:{port}/" in out
    assert f"http://127.0.0.1:{port}/docs" in out


def test_serve_with_token_and_demo_flags() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(
        "--port", str(port), "--num-blocks", "512", "--token", "Zq7-very-secret", "--demo",
        "--demo-rate", "20", "--hash-fn", "xxhash",
    )  # fmt: skip
    try:
        wait_healthy(proc, url)
        cfg = httpx.get(f"{url}/api/config").json()
        assert cfg["auth_required_for_writes"] is True and cfg["hash_fn"] == "xxhash"
        r = httpx.post(f"{url}/api/pool/allocate", json={"num_blocks": 1})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{url}/api/demo").json()["running"] is True
    finally:
        out = stop(proc)
    assert_clean_exit(proc, out)
    assert "demo on at 20.0/s" in out and "auth token required for writes" in out
    assert "Zq7-very-secret" not in out  # the token is never logged


def test_invalid_flag_exits_2_as_a_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--num-blocks", "many"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--num-blocks: invalid int value: 'many'" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--bogus"], "unrecognized arguments: --bogus"),
        (["serve", "--hash-fn", "md5"], "invalid choice: 'md5'"),
        (["serve", "--port", "x"], "invalid int value"),
        (["serve", "--num-blocks", "10", "--memory-budget", "100"], "not allowed with argument"),
        ([], "the following arguments are required: command"),
        (["launch"], "invalid choice: 'launch'"),
        (["serve", "--log-level", "loud"], "invalid choice: 'loud'"),
    ],
)
def test_invalid_flags_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["serve", "--num-blocks", "1"], "num_blocks"),
        (["serve", "--port", "70000"], "port"),
        (["serve", "--block-size", "0"], "block_size"),
        (["serve", "--metrics-sample-rate", "0"], "metrics_sample_rate"),
        (["serve", "--no-storage", "--memory-budget", "1000"], "needs storage on"),
        (["serve", "--memory-budget", "1000"], "holds no block"),  # was a traceback
        (["serve", "--tick-hz", "-1"], "tick_hz"),
    ],
)
def test_invalid_settings_exit_2(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "blockpool: invalid settings" in err and field in err


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOCKPOOL_NUM_BLOCKS", "999")
    monkeypatch.setenv("BLOCKPOOL_BLOCK_SIZE", "32")
    s = settings_from(parser().parse_args(["serve", "--num-blocks", "100"]))
    assert s.num_blocks == 100 and s.block_size == 32
    s = settings_from(parser().parse_args(["serve", "--no-caching", "--no-events"]))
    assert s.enable_caching is False and s.enable_events is False and s.num_blocks == 999
    text = describe(s, 999)
    assert "999 blocks x 32 tokens" in text and "caching off" in text and "events off" in text


def test_model_name_flag_labels_the_metrics() -> None:
    from prometheus_client import generate_latest

    from app.pool.engine import Engine
    from app.pool.scrape import make_registry

    default = settings_from(parser().parse_args(["serve", "--no-storage"]))
    assert default.model_name == "blockpool-demo"
    s = settings_from(parser().parse_args(["serve", "--no-storage", "--model-name", "llama-3-8b"]))
    assert s.model_name == "llama-3-8b"
    engine = Engine(s.model_copy(update={"num_blocks": 64, "analysis_mode": "inline"}))
    text = generate_latest(make_registry(engine, {})[0]).decode()
    assert 'model_name="llama-3-8b"' in text and "blockpool-demo" not in text
    engine.check()
