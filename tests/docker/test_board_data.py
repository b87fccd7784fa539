"""The board beside vLLM's (docker/grafana/dashboards/blockpool-vllm.json)
answered with data by a real Prometheus scraping a real ``blockpool serve
--demo`` (its KV events published) and a real ``blockpool observe``
following them: every panel that does not need a mirror of a vLLM engine
gets series, with its variables put in as Grafana would, and its shares are
shares.  The mirror's panels are named here: they need a mirror (their
series names are checked in test_boards.py, against a mirror's figures)."""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.docker.prometheus_bin import prometheus_server
from tests.docker.test_boards import BESIDE, board, board_exprs, templated, var_query, variables
from tests.support.cli import ROOT, cli_env, stop_cli_server, wait_healthy
from tests.support.ports import free_port
from tests.support.wait import eventually

MODEL = "test-model"
NEEDS_A_MIRROR = {
    "Mirror: exact / behind / silent",
    "Mirror lag: backlog and behind",
    "Plugin time per scheduler step",
    "Mirror problems",
}
SHARES = {"Evicted-miss share", "Regret rate"}


def _child(cmd: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *cmd, "--port", str(port)],
            cwd=ROOT, env=cli_env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", log)
    except AssertionError:
        stop_cli_server(proc)
        raise
    return proc


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    """serve --demo (a small pool: evictions, regrets) + observe + Prometheus
    scraping both every second; a client on Prometheus's API and the jobs."""
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bp-board-") as tmp:
        t = Path(tmp)
        app, obs = free_port(), free_port()
        pub, rep = free_port(), free_port()
        try:
            procs.append(_child([
                "serve", "--num-blocks", "128", "--demo", "--demo-rate", "40",
                "--model-name", MODEL, "--shadow-mode", "inline", "--log-level", "warning",
                "--kv-events", "--kv-events-endpoint", f"tcp://127.0.0.1:{pub}",
                "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{rep}",
            ], app, t / "serve.log"))  # fmt: skip
            procs.append(_child([
                "observe", f"app=tcp://127.0.0.1:{pub}", "--replay", f"tcp://127.0.0.1:{rep}",
            ], obs, t / "observe.log"))  # fmt: skip
            jobs = {"blockpool": f"127.0.0.1:{app}", "blockpool-observer": f"127.0.0.1:{obs}"}
            with prometheus_server(jobs) as client:
                yield client, jobs
        finally:
            for p in reversed(procs):
                stop_cli_server(p)


def query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    r = client.get("/api/v1/query", params={"query": expr, "time": f"{time.time():.3f}"}).json()
    assert r["status"] == "success", (expr, r)
    result: list[dict[str, Any]] = r["data"]["result"]
    return result


def test_the_variables_list_what_grafana_would(stack: tuple[httpx.Client, dict[str, str]]) -> None:
    client, jobs = stack
    b = board(BESIDE)
    for name, want in (("model_name", {MODEL}), ("job", set(jobs))):
        v = variables(b)[name]
        match = var_query(v).removeprefix("label_values(").rsplit(",", 1)[0]
        r = client.get(f"/api/v1/label/{name}/values", params={"match[]": match}).json()
        assert set(r["data"]) == want, (name, r)


def test_every_panel_without_a_mirror_answers_with_data(
    stack: tuple[httpx.Client, dict[str, str]],
) -> None:
    client, _ = stack
    b = board(BESIDE)
    panels = {}
    for title, expr in board_exprs(b):
        panels.setdefault(title, []).append(templated(expr, b))
    assert set(panels) >= NEEDS_A_MIRROR

    def figures(expr: str) -> list[float]:
        """The finite values of ``expr`` now (NaN, a 0/0, is no figure)."""
        values = [float(s["value"][1]) for s in query(client, expr)]
        return [v for v in values if math.isfinite(v)]

    def empty() -> list[str]:
        """Panels with a query that has no series, or no finite figure at all."""
        return [
            t for t, exprs in panels.items()
            if t not in NEEDS_A_MIRROR
            and not (all(query(client, e) for e in exprs) and any(figures(e) for e in exprs))
        ]  # fmt: skip

    # the demo has to evict, regret and re-store before every panel has a series
    eventually(lambda: not empty(), 240, "every panel's series", poll=2)
    for title in SHARES:
        for expr in panels[title]:
            for series in query(client, expr):
                value = float(series["value"][1])
                assert 0 <= value <= 1 or math.isnan(value), (title, series)  # NaN: 0/0
    ((whatif,),) = [exprs for t, exprs in panels.items() if t.startswith("Δ hit rate per size")]
    deltas = query(client, whatif)
    assert {s["metric"]["policy"] for s in deltas} >= {"append_all"}
    assert all(-1 <= float(s["value"][1]) <= 1 for s in deltas)
