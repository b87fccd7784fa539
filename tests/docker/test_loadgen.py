"""The load generator (docker/loadgen/loadgen.py): the bodies it builds pass
the API's pydantic models, it reads its settings from the environment, runs
against a live uvicorn server with no 5xx, backs off on a full pool, and
exits non-zero on repeated 5xx or a refused token."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.pool.schemas import BODIES, AdmitOp, AppendBody, BatchRequest
from app.shared.settings import Settings
from tests.docker.helpers import LOADGEN, ROOT


@pytest.fixture(scope="module")
def loadgen() -> ModuleType:
    """The script as a module; its sibling modules found as when it runs
    (its folder first on the path)."""
    spec = importlib.util.spec_from_file_location("blockpool_loadgen", LOADGEN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(LOADGEN.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(LOADGEN.parent))
    return module


def test_loadgen_bodies_match_the_api_models(loadgen: ModuleType) -> None:
    wl = loadgen.Workload(random.Random(3))
    kinds = set()
    prompts = []
    for _ in range(300):
        prompt = wl.next_prompt()
        kinds.add(prompt.kind)
        rid = wl.new_request_id()
        BODIES[AdmitOp].model_validate(loadgen.admit_body(rid, prompt))
        chunks = wl.decode_plan(8, 96)
        assert 8 <= sum(chunks) <= 96 and all(1 <= n <= 16 for n in chunks)
        AppendBody.model_validate(loadgen.append_body(wl.tokens(chunks[0])))
        batch = BatchRequest.model_validate(
            loadgen.batch_body(rid, prompt, [wl.tokens(n) for n in chunks])
        )
        assert [op.op for op in batch.ops][:2] == ["prefix_lookup", "admit"]
        assert batch.ops[-1].op == "finish" and batch.on_error == "continue"
        wl.end_turn(prompt, wl.tokens(10), ok=True)
        prompts.append(prompt.token_ids)
    assert kinds == {"chat", "document", "conversation", "noise"}
    # Shared prefixes: many prompts start with the same 64 tokens.
    heads: dict[tuple[int, ...], int] = {}
    for p in prompts:
        heads[tuple(p[:64])] = heads.get(tuple(p[:64]), 0) + 1
    assert max(heads.values()) >= 20
    assert len({wl.new_request_id() for _ in range(100)}) == 100


def test_loadgen_settings_from_env(loadgen: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOCKPOOL_URL", "http://app:8000/")
    monkeypatch.setenv("BLOCKPOOL_TOKEN", "s3cret")
    cfg = loadgen.parse_args(["--duration", "3"])
    assert (cfg.url, cfg.token, cfg.duration, cfg.stats_interval) == (
        "http://app:8000", "s3cret", 3.0, 10.0,
    )  # fmt: skip
    gen = loadgen.LoadGen(cfg)
    assert gen.client.headers["authorization"] == "Bearer s3cret"
    asyncio.run(gen.client.aclose())
    monkeypatch.setenv("BLOCKPOOL_TOKEN", "")
    assert loadgen.parse_args([]).token is None


@pytest.fixture
def uvicorn_server() -> Iterator[str]:
    import uvicorn

    app = create_app(Settings(num_blocks=1024, demo=False))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_loadgen_short_run_against_uvicorn(uvicorn_server: str) -> None:
    env = {**os.environ, "BLOCKPOOL_URL": uvicorn_server}
    env.pop("BLOCKPOOL_TOKEN", None)
    proc = subprocess.run(
        [sys.executable, str(LOADGEN), "--duration", "3", "--stats-interval", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[loadgen] t=")]
    assert len(lines) >= 3, proc.stdout  # a line per second, and the final one
    final = dict(kv.split("=", 1) for kv in lines[-1].split()[1:])
    assert final["5xx"] == "0" and final["4xx"] == "0" and final["transport"] == "0"
    assert int(final["admitted"]) > 0 and int(final["finished"]) == int(final["admitted"])
    assert int(final["decode_tokens"]) > 0 and float(final["hit_rate"]) > 0
    # Every request it admitted was finished: none is left holding blocks.
    left = httpx.get(f"{uvicorn_server}/api/requests", params={"limit": 1000}).json()
    assert "lg-" not in json.dumps(left)
    summary = httpx.get(f"{uvicorn_server}/api/summary").json()
    assert summary["running_requests"] == 0 and summary["blocks"]["in_use"] == 0


def test_loadgen_backs_off_when_the_pool_is_full(loadgen: ModuleType) -> None:
    async def go() -> Any:
        app = create_app(Settings(num_blocks=160, demo=False))
        async with app.router.lifespan_context(app):
            cfg = loadgen.Config(url="http://127.0.0.1:8000", duration=2.0, stats_interval=1.0,
                                 concurrency=8, seed=5, think_time=0.0)  # fmt: skip
            gen = loadgen.LoadGen(cfg, httpx.ASGITransport(app=app))
            code = await gen.run()
            return code, gen.stats, app.state.engine.manager.requests

    code, stats, running = asyncio.run(go())
    assert code == 0
    assert stats.status_409 > 0 and stats.status_5xx == 0 and stats.status_4xx == 0
    assert stats.admit_retries > 0 or stats.preempted > 0
    assert stats.admitted > 0 and not running


def test_loadgen_exits_nonzero_on_repeated_5xx(loadgen: ModuleType) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(500, json={"error": {"status": 500, "code": "internal"}})

    cfg = loadgen.Config(url="http://127.0.0.1:8000", duration=30.0, max_5xx=5, concurrency=2)
    t0 = time.monotonic()
    code = asyncio.run(loadgen.run(cfg, httpx.MockTransport(handler)))
    assert code == loadgen.EXIT_5XX == 1
    assert time.monotonic() - t0 < 10


def test_loadgen_exits_when_the_token_is_refused(loadgen: ModuleType) -> None:
    async def go() -> int:
        app = create_app(Settings(num_blocks=64, demo=False, token="right"))
        async with app.router.lifespan_context(app):
            cfg = loadgen.Config(url="http://127.0.0.1:8000", duration=30.0, token="wrong")
            code: int = await loadgen.run(cfg, httpx.ASGITransport(app=app))
            return code

    assert asyncio.run(go()) == loadgen.EXIT_AUTH
