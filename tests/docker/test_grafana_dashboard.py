"""The Grafana dashboard (docker/grafana/dashboards/blockpool.json): valid
panels and variables, the panels it must have, every PromQL
expression names only series that a live app exposes (scraped from a real
in-process app after churn) with label matchers that select something, and
vLLM's own KV-cache panel queries evaluate against us."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from typing import Any

import httpx
import pytest
import zmq

from app.main import create_app
from app.observer.app import create_observer_app
from app.shared.settings import ObserverSettings, Settings
from tests.docker.helpers import DASHBOARD, MODEL, STREAM_METRICS, TARGET_LABELS, datasource
from tests.docker.promql import NAME, Live, Scrape, check_selector, evaluate, selectors
from tests.kvevents.helpers import Workload, await_for, free_port, positional

# The KV-cache queries of vLLM's example Grafana dashboard
# (examples/online_serving/prometheus_grafana/grafana.json, "Cache
# Utilization" and "Scheduler State" panels; the V1 engine renamed
# vllm:gpu_cache_usage_perc to vllm:kv_cache_usage_perc), and the prefix-cache
# hit rate as vLLM's metrics design doc defines it from its two counters.
VLLM_REFERENCE = {
    "kv_cache_usage": 'vllm:kv_cache_usage_perc{model_name="$model_name"}',
    "prefix_cache_hit_rate": (
        'rate(vllm:prefix_cache_hits_total{model_name="$model_name"}[$__rate_interval])'
        " / "
        'rate(vllm:prefix_cache_queries_total{model_name="$model_name"}[$__rate_interval])'
    ),
    "num_requests_running": 'vllm:num_requests_running{model_name="$model_name"}',
}


def test_selector_extraction() -> None:
    expr = (
        "histogram_quantile(0.9, sum by (le, job) (rate(vllm:kv_block_lifetime_seconds_bucket"
        '{model_name=~"$model_name", job=~"$job"}[$__rate_interval]))) / on (job) '
        "group_left sum without (state) (blockpool_blocks offset 5m) > bool 2e3"
    )
    sels = selectors(expr)
    assert [s.name for s in sels] == ["vllm:kv_block_lifetime_seconds_bucket", "blockpool_blocks"]
    assert sels[0].wrapped_by == "rate" and sels[1].wrapped_by == "sum"
    assert selectors("a_total / b")[1].wrapped_by is None
    assert selectors("histogram_quantile(0.5, x_bucket)")[0].wrapped_by == "histogram_quantile"
    assert sels[0].matchers == (("model_name", "=~", "$model_name"), ("job", "=~", "$job"))
    assert selectors('label_values(vllm:cache_config_info{job=~"$job"}, model_name)')[0].name == (
        "vllm:cache_config_info"
    )


# ------------------------------------------------------------ the live series


async def _churn() -> Live:
    """A real app, driven through its REST API until every histogram has
    samples: shared prefixes (hits, reuse), unique prompts that evict them,
    a batch, a reset (AllBlocksCleared)."""
    settings = Settings(
        num_blocks=64, block_size=16, metrics_sample_rate=1.0, model_name=MODEL, demo=False
    )
    app = create_app(settings)
    rng = random.Random(7)

    def toks(n: int) -> list[int]:
        return [rng.randrange(32000) for _ in range(n)]

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:

            async def ok(method: str, path: str, body: Any = None) -> dict[str, Any]:
                r = await c.request(method, path, json=body)
                assert r.status_code < 300, (path, r.status_code, r.text)
                data: dict[str, Any] = r.json()
                return data

            async def scrape() -> Scrape:
                r = await c.get("/metrics")
                assert r.status_code == 200
                return Scrape(time.monotonic(), r.text, await ok("GET", "/api/summary"))

            prefix = toks(160)
            await ok("POST", "/api/requests", {"request_id": "p0", "token_ids": prefix + toks(20)})
            await ok("POST", "/api/requests/p0/finish")
            first = await scrape()
            for i in range(1, 4):
                await asyncio.sleep(0.01)
                body = {"request_id": f"p{i}", "token_ids": prefix + toks(20)}
                adm = await ok("POST", "/api/requests", body)
                assert adm["num_hit_blocks"] > 0
                await ok("POST", f"/api/requests/p{i}/tokens", {"token_ids": toks(24)})
                await ok("POST", f"/api/requests/p{i}/finish")
            for i in range(8):  # unique prompts: the pool's 63 blocks turn over
                await ok("POST", "/api/requests", {"request_id": f"u{i}", "token_ids": toks(320)})
                await ok("POST", f"/api/requests/u{i}/finish")
            batch = {
                "ops": [
                    {"op": "admit", "request_id": "b0", "token_ids": prefix + toks(5)},
                    {"op": "append", "request_id": "b0", "token_ids": toks(3)},
                    {"op": "finish", "request_id": "b0"},
                ]
            }
            assert (await ok("POST", "/api/batch", batch))["failed"] == 0
            await ok("POST", "/api/pool/reset")
            await ok("POST", "/api/requests", {"request_id": "r0", "token_ids": prefix})
            last = await scrape()
            await ok("POST", "/api/requests/r0/finish")
    return Live(first, last)


async def _observed() -> str:
    """A real observer's /metrics after it followed a publisher: batches, a
    poison message, a gap (the series its panels name)."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub.bind(endpoint)
    app = create_observer_app(ObserverSettings(endpoints=[f"engine-a={endpoint}"]))
    try:
        async with app.router.lifespan_context(app):
            src = app.state.fleet.sources["engine-a"]
            assert await asyncio.to_thread(pub.poll, 30_000), "no subscription"
            pub.recv()
            batches = Workload(seed=31, lora=False).batches(6)
            for i, evs in enumerate(batches):
                if i != 3:  # one lost: a gap
                    pub.send_multipart([b"", i.to_bytes(8, "big"), positional(evs)])
            pub.send_multipart([b"", b"short"])  # poison: bad frames
            await await_for(lambda: src.tracker.applied == 5, 30, "the observer fed")
            await await_for(lambda: src.poison.total == 1, 30, "the poison counted")
            transport = httpx.ASGITransport(app=app)
            base = "http://127.0.0.1:8002"  # a loopback name: the Host check allows it
            async with httpx.AsyncClient(transport=transport, base_url=base) as c:
                r = await c.get("/metrics")
                assert r.status_code == 200
                return r.text
    finally:
        pub.close(linger=0)
        ctx.term()


@pytest.fixture(scope="module")
def live() -> Live:
    result = asyncio.run(_churn())
    observer = asyncio.run(_observed())  # the observer's series, as a second target
    for scrape in (result.first, result.last):
        scrape.text += observer
    for name in ("lifetime", "idle_before_evict", "reuse_gap"):
        count = [
            v for n, _, v, _ in result.last.samples()
            if n == f"vllm:kv_block_{name}_seconds_count"
        ]  # fmt: skip
        assert count and count[0] > 0, f"no {name} samples: not enough churn"
    return result


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expression) for every query of the dashboard."""
    out = []
    out.extend(
        (panel["title"], t["expr"])
        for panel in dashboard()["panels"]
        for t in panel.get("targets", [])
    )
    for name, inner, _ in variable_queries():
        out.append((f"${name}", inner))
    return out


def variable_queries() -> list[tuple[str, str, str]]:
    """(variable, series expression, label) of each label_values() variable."""
    out = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(rf"\s*label_values\((.+),\s*({NAME})\s*\)\s*", q)
        assert m, f"${var['name']}: only label_values(series, label) is used: {q}"
        out.append((var["name"], m.group(1), m.group(2)))
    return out


# ------------------------------------------------------------------ dashboard


def test_dashboard_json_is_valid() -> None:
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["panels"], list)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    uid = datasource()["uid"]
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["targets"], f"{p['title']}: no query"
        assert p["datasource"]["uid"] == uid, p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == uid, p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    variables = {v["name"] for v in d["templating"]["list"]}
    for _, expr in dashboard_exprs():
        for var in re.findall(r"\$(\w+)", expr):
            assert var in variables or var.startswith("__"), f"${var} is not defined"


def test_dashboard_has_the_issue_panels() -> None:
    exprs = [e for _, e in dashboard_exprs()]
    panels = {p["title"]: p for p in dashboard()["panels"]}

    def has(pattern: str) -> bool:
        return any(re.search(pattern, e) for e in exprs)

    blocks = panels["Blocks by state"]
    assert "by (state)" in blocks["targets"][0]["expr"]
    assert blocks["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert has(r"^vllm:kv_cache_usage_perc\{")
    # the hit rate over the windows the page's tiles promise (1m, 5m), not
    # Grafana's rate interval, on the stat and on the time series
    for window in ("1m", "5m"):
        for agg in (r"sum", r"sum by \(job\) "):
            assert has(
                rf"^{agg}\(rate\(vllm:prefix_cache_hits_total\{{[^}}]*\}}\[{window}\]\)\)"
                rf"\s*/\s*{agg}\(rate\(vllm:prefix_cache_queries_total\{{[^}}]*\}}\[{window}\]\)\)$"
            ), (agg, window)
    hit_rate = [e for e in exprs if "rate(vllm:prefix_cache_hits_total" in e and " / " in e]
    assert hit_rate and not [e for e in hit_rate if "$__rate_interval" in e]
    assert has(r"^sum by \(job\) \(vllm:num_requests_waiting\{")
    # the observer's panels: every one by pool, the label all its metrics carry
    observer = [e for e in exprs if "blockpool_observer_" in e]
    for name in ("connected", "exact", "stale", "last_batch_age_seconds"):
        assert has(rf"by \(pool\) \(blockpool_observer_{name}\{{pool=~\"\$pool\"\}}\)"), name
    assert all("by (pool)" in e or e.startswith("blockpool_observer_") for e in observer)
    assert has(r"rate\(blockpool_evictions_total") and has(r"rate\(blockpool_blocks_allocated")
    for name in ("lifetime", "idle_before_evict", "reuse_gap"):
        quantile = r"histogram_quantile\(0\.\d+, sum by \((job, )?le\) \(rate\("
        assert has(rf"{quantile}vllm:kv_block_{name}_seconds_bucket"), name
    assert has(r"sum by \(type\) \(rate\(blockpool_kv_events_total")
    stream = {s.name for e in exprs for s in selectors(e) if s.name.startswith("blockpool_stream")}
    assert stream == STREAM_METRICS


def test_dashboard_queries_name_live_series(live: Live) -> None:
    errors = []
    used = set()
    for title, expr in dashboard_exprs():
        sels = selectors(expr)
        assert sels, f"{title}: {expr} names no metric"
        for sel in sels:
            used.add(sel.name)
            errors += [f"{title}: {e}" for e in check_selector(sel, live.last)]
    for name, inner, label in variable_queries():
        (sel,) = selectors(inner)
        found = [lb for n, lb, _, _ in live.last.samples() if n == sel.name]
        if label not in TARGET_LABELS and not any(label in lb for lb in found):
            errors.append(f"${name}: {sel.name} has no label {label!r}")
    assert not errors, "\n".join(errors)
    assert len(used) >= 20, sorted(used)


def test_name_checks_catch_mistakes(live: Live) -> None:
    """The suffix rules: a counter is only there as _total, a histogram as
    _bucket/_sum/_count, and rate() of a gauge or a typo'd label is caught."""
    bad = (
        "rate(vllm:prefix_cache_hits[1m])",  # a counter is there only as _total
        "vllm:kv_block_lifetime_seconds",  # a histogram only as _bucket/_sum/_count
        "blockpool_blocks_total",  # a gauge has no _total
        "rate(blockpool_free_blocks[1m])",  # rate() of a gauge
        "histogram_quantile(0.5, vllm:kv_block_lifetime_seconds_bucket)",  # no rate()
        'blockpool_blocks{state="inuse"}',  # no such state
        'vllm:kv_cache_usage_perc{model_name="other"}',  # another model
        "rate(blockpool_stream_typo_total[1m])",  # not a documented stream metric
    )
    for expr in bad:
        (sel,) = selectors(expr)
        assert check_selector(sel, live.last), f"{expr} should be refused"
    good = (
        "rate(vllm:prefix_cache_hits_total[1m])",
        "rate(vllm:kv_block_lifetime_seconds_count[1m])",
        'blockpool_blocks{state="in_use"}',
        'sum by (type) (blockpool_kv_events_total{type="BlockRemoved"})',
    )
    for expr in good:
        for sel in selectors(expr):
            assert not check_selector(sel, live.last), expr


# -------------------------------------------------- vLLM's panels evaluate


def test_vllm_kv_cache_panels_evaluate(live: Live) -> None:
    usage = evaluate(VLLM_REFERENCE["kv_cache_usage"], live)
    assert len(usage) == 1
    (value,) = usage.values()
    assert value == pytest.approx(live.last.summary["usage"]) and 0 < value <= 1

    hit_rate = evaluate(VLLM_REFERENCE["prefix_cache_hit_rate"], live)
    assert len(hit_rate) == 1, "hits and queries must carry the same labels"
    (value,) = hit_rate.values()
    a, b = live.first.summary["prefix_cache"], live.last.summary["prefix_cache"]
    expected = (b["hits_tokens"] - a["hits_tokens"]) / (b["queries_tokens"] - a["queries_tokens"])
    assert value == pytest.approx(expected) and 0 < value < 1

    running = evaluate(VLLM_REFERENCE["num_requests_running"], live)
    assert list(running.values()) == [live.last.summary["running_requests"]] == [1]
    for labels in (*usage, *hit_rate, *running):
        assert dict(labels)["model_name"] == MODEL and dict(labels)["engine"] == "0"
