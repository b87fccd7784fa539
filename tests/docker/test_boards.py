"""Every Grafana board under docker/grafana/dashboards (the compose board and
the one beside vLLM's): each PromQL expression, with its variables put in as
Grafana would, parses in a real Prometheus; each names only series blockpool
exports (a real in-process service, a mirror's figures and an observer,
scraped with a test client) and the alert rules too; and the board beside
vLLM's has vLLM's variables, blockpool's own signals and, on every panel,
a link to the page's time travel at the clicked moment."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.main import create_app
from app.mirror.status import MirrorStatus, figures_of
from app.observer.app import create_observer_app
from app.shared.settings import ObserverSettings, Settings
from tests.docker.helpers import DASHBOARD, DASHBOARD_PROVIDERS, DOCKER, MODEL, TARGET_LABELS
from tests.docker.prometheus_bin import prometheus_server
from tests.docker.promql import Scrape, check_selector, selectors
from tests.support.ports import free_port

BOARDS = sorted((DOCKER / "grafana" / "dashboards").glob("*.json"))
BESIDE = DOCKER / "grafana" / "dashboards" / "blockpool-vllm.json"
RULES = DOCKER / "prometheus" / "rules" / "blockpool.rules.yml"
RULE_TESTS = DOCKER / "prometheus" / "rules" / "blockpool.rules.test.yml"
# vLLM's own board (examples/online_serving/prometheus_grafana/grafana.json):
# its model_name variable, as it defines it
VLLM_MODEL_NAME = 'label_values({__name__=~"vllm:.*"},model_name)'
PAGE_AT = "${blockpool_url}/?at=${__value.time}"
# What Grafana puts in for its own variables, and All for a multi-value one
GRAFANA_VARS = {"__rate_interval": "20s", "__interval": "5s", "__range": "1h"}


def board(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def panels(b: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in b["panels"] if p["type"] != "row"]


def variables(b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in b["templating"]["list"]}


def var_query(v: dict[str, Any]) -> str:
    q = v["query"]
    return str(q["query"] if isinstance(q, dict) else q)


def board_exprs(b: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels(b) for t in p["targets"]]


def templated(expr: str, b: dict[str, Any]) -> str:
    """``expr`` as Grafana sends it: its variables and multi-value All put in."""
    vs = variables(b)

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in GRAFANA_VARS:
            return GRAFANA_VARS[name]
        v = vs[name]
        if v.get("includeAll"):
            return str(v.get("allValue") or ".*")
        return MODEL if name == "model_name" else "x"

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def rule_exprs() -> list[tuple[str, str]]:
    data = yaml.safe_load(RULES.read_text())
    return [(r["alert"], r["expr"]) for g in data["groups"] for r in g["rules"]]


# ------------------------------------------------------- the board beside vLLM


def test_the_board_beside_vllm_has_vllms_variables() -> None:
    b = board(BESIDE)
    vs = variables(b)
    ds = vs["DS_PROMETHEUS"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert var_query(vs["model_name"]) == VLLM_MODEL_NAME and not vs["model_name"]["multi"]
    assert var_query(vs["job"]) == 'label_values({__name__=~"blockpool_.*"},job)'
    assert var_query(vs["instance"]) == (
        'label_values({__name__=~"blockpool_.*", job=~"$job"},instance)'
    )
    for name in ("job", "instance"):
        assert vs[name]["multi"] and vs[name]["includeAll"] and vs[name]["allValue"] == ".*"
    assert vs["blockpool_url"]["type"] == "textbox"
    for p in panels(b):
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
            # blockpool's series by the service scraped; vLLM's by model, as vLLM's board
            for sel in selectors(t["expr"]):
                labels = {lbl for lbl, _, _ in sel.matchers}
                if sel.name.startswith("vllm:"):
                    assert ("model_name", "=", "$model_name") in sel.matchers, t["expr"]
                else:
                    assert {"job", "instance"} <= labels, (p["title"], sel.name)


def test_every_panel_links_to_time_travel_at_the_clicked_moment() -> None:
    for b in (board(BESIDE),):
        for p in panels(b):
            links = p["fieldConfig"]["defaults"]["links"]
            assert any(lk["url"] == PAGE_AT for lk in links), p["title"]
            corner = {lk["url"] for lk in p["links"]}
            assert {"${blockpool_url}/?at=${__from}", "${blockpool_url}/?at=${__to}"} <= corner
            for lk in links + p["links"]:
                assert lk["targetBlank"] is True
                assert "token" not in lk["url"].lower()  # no secret in a URL


def test_the_board_beside_vllm_shows_blockpools_signals() -> None:
    b = board(BESIDE)
    exprs = [e for _, e in board_exprs(b)]

    def has(pattern: str) -> bool:
        return any(re.search(pattern, e) for e in exprs)

    assert has(r"sum by \(reason\) \(rate\(blockpool_prefix_misses_total\{")
    assert has(r'blockpool_prefix_misses_total\{reason="evicted"')
    assert has(r"histogram_quantile\(0\.5, sum by \(le\) \(rate\(blockpool_eviction_regret_gap")
    assert has(r"rate\(blockpool_eviction_regrets_total\{[^}]*\}\[5m\]\)\) / ")
    # what-if: each shadow's hit rate minus the engine's actual one (vLLM's counters)
    assert has(
        r"^\(sum by \(policy, capacity_factor\) \(rate\(blockpool_shadow_hits_tokens_total.*\) / "
        r"sum by \(policy, capacity_factor\) \(rate\(blockpool_shadow_queries_tokens_total.*\)\)"
        r" - scalar\(sum\(rate\(vllm:prefix_cache_hits_total\{.*\) / "
        r"sum\(rate\(vllm:prefix_cache_queries_total\{.*\)\)$"
    )
    for name in ("exact", "behind", "stale", "backlog", "plugin_step_p99_us"):
        assert has(rf"blockpool_mirror_{name}\{{"), name
    for name in ("exact", "stale", "last_batch_age_seconds", "missed_batches_total"):
        assert has(rf"blockpool_observer_{name}\{{"), name
    # alert thresholds drawn where the rules put them
    th = {
        p["title"]: p["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"]
        for p in panels(b)
        if "thresholds" in p["fieldConfig"]["defaults"] and p["type"] == "timeseries"
    }
    rules = dict(rule_exprs())
    assert th["Evicted-miss share"] == 0.2 and ") > 0.2\n" in rules["BlockpoolEvictedMissShareHigh"]
    assert th["Regret rate"] == 0.3 and ") > 0.3\n" in rules["BlockpoolEvictionRegretRateHigh"]
    assert th["Plugin time per scheduler step"] == 5000
    assert "> 5000" in rules["BlockpoolPluginStepCostHigh"]


def test_the_boards_are_provisioned_side_by_side() -> None:
    assert BESIDE in BOARDS and DASHBOARD in BOARDS
    providers = [
        p for f in sorted(DASHBOARD_PROVIDERS.glob("*.yml"))
        for p in yaml.safe_load(f.read_text())["providers"]
    ]  # fmt: skip
    assert [p["type"] for p in providers] == ["file"]  # the folder: every JSON in it
    uids = [board(p)["uid"] for p in BOARDS]
    assert len(uids) == len(set(uids))
    for path in BOARDS:
        b = board(path)
        ids = [p["id"] for p in b["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for p in b["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, (path.name, p["title"])
        for _, expr in board_exprs(b):
            for var in re.findall(r"\$\{?(\w+)", expr):
                assert var in variables(b) or var in GRAFANA_VARS, (path.name, var)


# ------------------------------------------------ parsed by a real Prometheus


def test_every_board_query_parses_in_prometheus() -> None:
    with prometheus_server() as prom:

        def problem(expr: str) -> str | None:
            r = prom.post("/api/v1/query", data={"query": expr, "time": f"{time.time():.3f}"})
            body = r.json()
            return None if body["status"] == "success" else f"{body['errorType']}: {body['error']}"

        # the check can fail: broken expressions are refused
        for bad in ("rate(blockpool_operations_total[5m]", "sum by (reason (x)", "x{a=~}"):
            assert problem(bad), bad
        errors = []
        count = 0
        for path in BOARDS:
            b = board(path)
            for title, expr in board_exprs(b):
                count += 1
                if why := problem(templated(expr, b)):
                    errors.append(f"{path.name}: {title}: {why}\n  {expr}")
            for v in variables(b).values():
                if v["type"] != "query":
                    continue
                m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var_query(v))
                assert m, var_query(v)
                match = templated(m.group(1), b)
                r = prom.get("/api/v1/series", params={"match[]": match})
                if r.json()["status"] != "success":
                    errors.append(f"{path.name}: ${v['name']}: {r.json()}")
        assert not errors, "\n".join(errors)
        assert count >= 40


# ------------------------------------------ names blockpool actually exports


async def _exposition() -> str:
    """/metrics of a real service (after requests: every analysis family
    there), with a mirror's figures (a mirror whose engine reported its
    step cost) and a real observer following one pool."""
    settings = Settings(
        num_blocks=64, block_size=16, metrics_sample_rate=1.0, model_name=MODEL, demo=False,
        analysis_mode="inline", shadow_mode="inline",
    )  # fmt: skip
    app = create_app(settings)
    rng = random.Random(11)
    texts = []
    async with app.router.lifespan_context(app):
        status = MirrorStatus(endpoint="tcp://127.0.0.1:1", control_endpoint="tcp://127.0.0.1:2")
        status.engine_cost_us = (1.0, 2.0, 3.0)
        app.state.metrics_sources["mirror"] = figures_of(status)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            prefix = [rng.randrange(32000) for _ in range(160)]
            for i in range(8):  # a shared prefix (hits), unique tails that turn the pool over
                tail = rng.choices(range(32000), k=300)
                body = {"request_id": f"r{i}", "token_ids": prefix + tail}
                assert (await c.post("/api/requests", json=body)).status_code == 201
                assert (await c.post(f"/api/requests/r{i}/finish")).status_code == 200
            r = await c.get("/metrics")
            assert r.status_code == 200
            texts.append(r.text)
        app.state.engine.check()  # the pool's invariants after the requests
    observer = create_observer_app(
        ObserverSettings(endpoints=[f"engine-a=tcp://127.0.0.1:{free_port()}"])
    )
    async with observer.router.lifespan_context(observer):
        transport = httpx.ASGITransport(app=observer)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8002") as c:
            r = await c.get("/metrics")
            assert r.status_code == 200
            texts.append(r.text)
    return "".join(texts)


@pytest.fixture(scope="module")
def exported() -> Scrape:
    return Scrape(time.monotonic(), asyncio.run(_exposition()), {})


def declared(text: str) -> set[str]:
    """Series names of every family the exposition declares (# TYPE), samples
    or not: a counter with no sample yet is still exported by that name."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    out = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\w+)$", text, re.M):
        base = name.removesuffix("_total") if kind == "counter" else name
        out |= {base + s for s in suffixes.get(kind, ("",))}
    return out


def name_problems(sel: Any, exported: Scrape) -> list[str]:
    """check_selector's problems, less "no such series" for a declared family
    that has no sample yet (its labels cannot be checked then)."""
    if sel.name in declared(exported.text) and sel.name not in {
        n for n, _, _, _ in exported.samples()
    }:
        return []
    return check_selector(sel, exported)


def test_every_board_and_rule_names_exported_series(exported: Scrape) -> None:
    names = {n for n, _, _, _ in exported.samples()} | declared(exported.text)
    errors = []
    used: set[str] = set()
    for path in BOARDS:
        b = board(path)
        for title, expr in board_exprs(b):
            for sel in selectors(expr):
                used.add(sel.name)
                errors += [f"{path.name}: {title}: {e}" for e in name_problems(sel, exported)]
        for v in variables(b).values():
            if v["type"] == "query":
                m = re.search(r'__name__=~"([^"]+)"', var_query(v))
                if m:  # label_values({__name__=~"..."}, label): some series matches
                    assert any(re.fullmatch(m.group(1), n) for n in names), var_query(v)
    rule_series = [s["series"] for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]
                   for s in t["input_series"]]  # fmt: skip
    for alert, expr in rule_exprs():
        for sel in selectors(expr):
            used.add(sel.name)
            errors += [f"{alert}: {e}" for e in name_problems(sel, exported)]
    for series in rule_series:  # the rules' unit tests feed exported series only
        name = series.split("{")[0]
        if name not in names:
            errors.append(f"{RULE_TESTS.name}: {name} is not exported")
        labels = set(re.findall(r"(\w+)=", series)) - TARGET_LABELS
        have = [lb for n, lb, _, _ in exported.samples() if n == name]
        if have and not any(labels <= set(lb) for lb in have):
            errors.append(f"{RULE_TESTS.name}: {series}: labels not exported")
    assert not errors, "\n".join(errors)
    assert len(used) >= 40, sorted(used)


def test_the_name_check_catches_a_renamed_series(exported: Scrape) -> None:
    for expr in (
        'rate(blockpool_prefix_misses_total{reason="evicted"}[5m])',
        "blockpool_mirror_exact",
        "blockpool_observer_stale",
    ):
        (sel,) = selectors(expr)
        assert not name_problems(sel, exported), expr
        renamed = expr.replace("blockpool_", "blockpool_old_")
        (sel,) = selectors(renamed)
        assert name_problems(sel, exported), renamed
    for bad in (
        'blockpool_prefix_misses_total{reason="evictd"}',  # no such reason
        "blockpool_mirror_exact_total",  # a gauge has no _total
        "rate(blockpool_mirror_backlog[5m])",  # rate() of a gauge
    ):
        (sel,) = selectors(bad)
        assert name_problems(sel, exported), bad
