"""No series of a mirror's or an observer's double-counts vLLM's own.

A real Prometheus scrapes a real engine (job ``engine``), its mirror
(``serve --mirror``, job ``mirror``) and a fleet observer of its KV events
(job ``observer``), once a second, through traffic.  Then:

* no series name of the mirror's or the observer's is one the engine exposes;
* every query of vLLM's own Grafana dashboards (the JSON vLLM 0.16.0 ships
  with its examples) gives, at moments during and after the traffic, the same
  answer as the same query with every vLLM selector restricted to the
  engine's job: the answer without the mirror and the observer;
* the README's join (the mirror's figure beside the engine's, ``on
  (model_name)``) says they are equal once the traffic is over.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.prometheus import (
    Prometheus,
    dashboard_queries,
    grafana_vars,
    only_job,
    prometheus_binary,
)
from tests.support.wait import eventually
from tests.vllm_engine.engine import block_tokens, free_port, metric_sum
from tests.vllm_engine.streams import abort, start_streams

pytestmark = pytest.mark.vllm_engine

WINDOW = "20s"  # Grafana's $__rate_interval, $__interval and $__range here
JOBS = ("engine", "mirror", "observer")


@pytest.fixture(scope="module")
def prom(mirrored: dict[str, Any]) -> Iterator[Prometheus]:
    prometheus_binary()  # skips (fails under BLOCKPOOL_REQUIRE_VLLM=1) without it
    work = mirrored["work"] / "prometheus"
    work.mkdir()
    targets = {
        job: mirrored[job].url.removeprefix("http://") for job in JOBS
    }  # the engine's /metrics, the mirror's, the observer's
    p = Prometheus(work, targets, free_port())
    try:
        eventually(p.ready, 120, "prometheus ready")
        yield p
    finally:
        p.stop()


def _all_up(prom: Prometheus) -> bool:
    got = prom.query("up", time.time())["result"]
    return {r["metric"]["job"] for r in got if r["value"][1] == "1"} == set(JOBS)


def _scraped_since(prom: Prometheus, t: float) -> bool:
    """Every job's target scraped after ``t`` (its ``up`` sample newer)."""
    got = prom.query("timestamp(up)", time.time())["result"]
    return len(got) == len(JOBS) and all(float(r["value"][1]) > t for r in got)


def _normal(data: dict[str, Any]) -> Any:
    """A query's answer, comparable: its type and its samples, sorted."""
    kind, result = data["resultType"], data["result"]
    if kind in ("scalar", "string"):
        return kind, result[1]
    rows = []
    for r in result:
        value = r["value"][1]
        if value not in ("NaN", "+Inf", "-Inf"):
            value = repr(round(float(value), 9))
        rows.append((tuple(sorted(r["metric"].items())), value))
    return kind, sorted(rows)


def test_no_series_double_counts_vllms(mirrored: dict[str, Any], prom: Prometheus) -> None:
    engine, client = mirrored["engine"], mirrored["client"]
    queries = dashboard_queries()
    eventually(lambda: _all_up(prom), 120, "every target up")
    eventually(
        lambda: client.get(mirrored["mirror"].url + "/api/mirror").json()["synced"], 240, "synced"
    )

    # traffic: prompts sharing a prefix (hits, requests that succeed), then
    # long streams in flight while Prometheus scrapes (running > 0)
    shared = [t for b in range(3) for t in block_tokens(70_000 + b)]
    for i in range(12):
        engine.complete(client, shared + block_tokens(71_000 + i))
    # (streams that end before every target was scraped once more -- a quick
    # engine, a slow scrape -- are followed by new ones: a scrape must see them)
    for attempt in range(4):
        streams = start_streams(engine.url, 3, max_tokens=900, first=200 + 10 * attempt)
        eventually(lambda ss=streams: all(s.first.is_set() for s in ss), 240, "streaming")
        mid = time.time()
        eventually(lambda t=mid: _scraped_since(prom, t), 60, "a scrape while streaming")
        if all(s.is_alive() for s in streams):
            break
        abort(streams)
    else:
        raise AssertionError("four times, the streams ended before a scrape")
    abort(streams)  # the clients go away: vLLM aborts them
    assert all(s.error is None for s in streams)

    # after the traffic: the mirror caught up, and scraped so
    def quiet() -> bool:
        theirs = client.get(engine.url + "/metrics").text
        mine = client.get(mirrored["mirror"].url + "/metrics").text
        return (
            metric_sum(theirs, "vllm:prefix_cache_hits_total")
            == metric_sum(mine, "blockpool_engine_prefix_cache_hits_total")
            and metric_sum(theirs, "vllm:num_requests_running") == 0
        )

    eventually(quiet, 120, "the mirror caught up")
    settled = time.time()
    eventually(lambda: _scraped_since(prom, settled + 1.0), 60, "scrapes after the traffic")
    end = time.time() - 0.5

    # 1. no name of the mirror's or the observer's is one of the engine's
    theirs = prom.names("engine")
    assert "vllm:num_requests_running" in theirs and "vllm:prefix_cache_hits_total" in theirs
    for job in ("mirror", "observer"):
        mine = prom.names(job)
        assert mine, f"nothing scraped from the {job}"
        assert not mine & theirs, (job, sorted(mine & theirs))
        assert not [n for n in mine if n.startswith("vllm:")], job
    assert "blockpool_engine_prefix_cache_hits_total" in prom.names("mirror")

    # 2. vLLM's dashboards answer as if only the engine were scraped
    values = {"model_name": "tiny", "Deployment_id": "tiny", "__rate_interval": WINDOW,
              "__interval": WINDOW, "__range": WINDOW}  # fmt: skip
    answered = 0
    for name, exprs in queries.items():
        for raw in exprs:
            expr = grafana_vars(raw, values)
            for at in (mid, end):
                full = _normal(prom.query(expr, at))
                alone = _normal(prom.query(only_job(expr, "engine"), at))
                assert full == alone, (name, expr, at, full, alone)
                answered += bool(full[1])
    assert answered >= 20, answered  # the dashboards had data to answer from
    # the scrapes from the streaming moment on (one instant's lookback may
    # hold a scrape from before the first request ran)
    window = max(1, int(settled - mid) + 1)
    running = prom.query(
        f'max_over_time(vllm:num_requests_running{{model_name="tiny"}}[{window}s])', settled
    )["result"]
    assert len(running) == 1 and float(running[0]["value"][1]) > 0, running

    # 3. the README's join: the mirror's figures beside the engine's, equal
    for ours, vllm in (
        ("blockpool_engine_prefix_cache_hits_total", "vllm:prefix_cache_hits_total"),
        ("blockpool_engine_prefix_cache_queries_total", "vllm:prefix_cache_queries_total"),
        ("blockpool_engine_kv_cache_usage_perc", "vllm:kv_cache_usage_perc"),
        ("blockpool_engine_num_requests_running", "vllm:num_requests_running"),
    ):
        joined = f"sum by (model_name) ({ours}) - on (model_name) sum by (model_name) ({vllm})"
        got = prom.query(joined, end)["result"]
        assert len(got) == 1 and math.isclose(float(got[0]["value"][1]), 0.0), (joined, got)
