"""The windowed prefix hit rate (app/pool/windowed.py) with an injected clock, and
the operator's figures in /metrics, /api/pool/rates and the series point."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.pool.windowed import HitWindow, prom_rate
from tests.app.conftest import Api

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------- prom_rate


def test_prom_rate_plain_extrapolates_to_the_range_start() -> None:
    # (35, 95]: samples every 10 s, the first 10 s after the start (< 1.1
    # intervals): extrapolated by 10 s at the start, 0 at the end
    pts = [(45.0 + 10 * i, 1000.0 + 60 * i) for i in range(6)]
    assert prom_rate(pts, 95.0, 60.0) == pytest.approx(300 * (60 / 50) / 60)


def test_prom_rate_stops_at_the_counters_zero_point() -> None:
    # a counter that starts at 0 in the range is not extrapolated below zero
    pts = [(45.0 + 10 * i, 60.0 * i) for i in range(6)]
    assert prom_rate(pts, 95.0, 60.0) == pytest.approx(300 / 60)


def test_prom_rate_counts_a_drop_as_a_counter_reset_and_is_left_open() -> None:
    pts = [(10.0, 100.0), (20.0, 150.0), (30.0, 20.0), (40.0, 70.0)]
    # increase 70 - 100 + 150 = 120 over 30 s; 10 s to the start (< 11): + 10
    # ... but the zero point: 30 * 100 / 120 = 25 s, not shorter than 10 s
    assert prom_rate(pts, 40.0, 40.0) == pytest.approx(120 * (40 / 30) / 40)
    # (0, 10] holds one sample: no value; a sample exactly at the start is out
    assert prom_rate(pts, 10.0, 10.0) is None
    assert prom_rate(pts, 20.0, 10.0) is None
    assert prom_rate(pts, 30.0, 20.0) is not None


def test_prom_rate_far_edges_extrapolate_by_half_an_interval() -> None:
    pts = [(50.0, 1000.0), (60.0, 1010.0)]  # 40 s from the start, 30 s from the end
    assert prom_rate(pts, 90.0, 80.0) == pytest.approx(10 * ((10 + 5 + 5) / 10) / 80)
    # the same from 0: the zero point is 10 s before the first sample (< 11)
    low = [(50.0, 10.0), (60.0, 20.0)]
    assert prom_rate(low, 90.0, 80.0) == pytest.approx(10 * ((10 + 10 + 5) / 10) / 80)


# -------------------------------------------------------------- HitWindow


def feed(w: HitWindow, clock: Clock, seconds: int, dh: int, dq: int, hq: list[int]) -> None:
    """``seconds`` ticks a second apart, hits/queries growing by dh/dq."""
    for _ in range(seconds):
        clock.t += 1.0
        hq[0] += dh
        hq[1] += dq
        w.observe(hq[0], hq[1])


def test_window_needs_two_samples_and_takes_one_a_second() -> None:
    clock = Clock()
    w = HitWindow(clock=clock)
    w.observe(0, 0)
    assert w.rate(60.0) is None and w.rate(300.0) is None
    clock.t += 0.5
    w.observe(5, 10)  # inside sample_s: not a sample
    assert len(w.samples) == 1 and w.rate(60.0) is None
    clock.t += 0.5
    w.observe(5, 10)
    assert len(w.samples) == 2
    assert w.rate(60.0) == pytest.approx(0.5)


def test_window_is_the_ratio_of_prometheus_rates_not_of_increases() -> None:
    clock = Clock()
    w = HitWindow(clock=clock)
    hq = [0, 1000]
    w.observe(*hq)  # hits start at 0 (zero point), queries do not
    feed(w, clock, 30, 3, 10, hq)
    at = clock.t
    hs = [(t, float(h)) for t, h, _ in w.samples]
    qs = [(t, float(q)) for t, _, q in w.samples]
    want = prom_rate(hs, at, 60.0) / prom_rate(qs, at, 60.0)  # type: ignore[operator]
    assert w.rate(60.0) == pytest.approx(want)
    # by hand: 31 samples over 30 s, the range starts 30 s before the first.
    # hits start at 0: not extrapolated back (zero point), 90 / 60 s.
    # queries: 30 s to the start is over 1.1 intervals: + half an interval.
    assert want == pytest.approx((90 / 60) / (300 * (30.5 / 30) / 60))
    assert want != pytest.approx(90 / 300)  # not the plain ratio of increases


def test_windows_follow_a_change_of_traffic() -> None:
    clock = Clock()
    w = HitWindow(clock=clock)
    hq = [0, 0]
    w.observe(*hq)
    feed(w, clock, 400, 9, 10, hq)  # 90% for 400 s
    assert w.rate(60.0) == pytest.approx(0.9) and w.rate(300.0) == pytest.approx(0.9)
    feed(w, clock, 120, 1, 10, hq)  # then 10% for 2 minutes
    assert w.rate(60.0) == pytest.approx(0.1)
    # 5 m: 180 s at 90% then 120 s at 10%, extrapolated alike in both counters
    assert w.rate(300.0) == pytest.approx((180 * 9 + 120 * 1) / (300 * 10), rel=0.02)
    assert w.since_start(*hq) == pytest.approx((400 * 9 + 120) / (520 * 10))
    assert len(w.samples) <= 301  # older samples leave


def test_no_query_in_the_window_is_nan() -> None:
    clock = Clock()
    w = HitWindow(clock=clock)
    hq = [0, 0]
    w.observe(*hq)
    feed(w, clock, 10, 0, 0, hq)
    assert math.isnan(w.rate(60.0))  # type: ignore[arg-type]
    assert w.since_start(*hq) is None
    pt = w.point(*hq)
    assert math.isnan(pt["hit_rate_1m"]) and math.isnan(pt["hit_rate_since"])


def test_a_reset_restarts_the_windows_and_since_start() -> None:
    clock = Clock()
    w = HitWindow(clock=clock)
    hq = [0, 0]
    w.observe(*hq, epoch=0)
    feed(w, clock, 100, 9, 10, hq)
    assert w.rate(60.0) == pytest.approx(0.9)
    clock.t += 1.0
    w.observe(hq[0], hq[1], epoch=1)  # a prefix-cache reset: the counters go on
    assert w.restarts == 1 and len(w.samples) == 1
    assert w.rate(60.0) is None and w.since_start(*hq) is None
    for _ in range(5):
        clock.t += 1.0
        hq[0] += 2
        hq[1] += 10
        w.observe(hq[0], hq[1], epoch=1)
    assert w.rate(60.0) == pytest.approx(0.2) and w.rate(300.0) == pytest.approx(0.2)
    assert w.since_start(*hq) == pytest.approx(0.2)
    s = w.summary(*hq)
    assert s["since_start"]["label"] == "since reset"
    assert s["since_start"]["hits_tokens"] == 10 and s["since_start"]["queries_tokens"] == 50
    assert [x["label"] for x in s["windows"]] == ["hit rate 1m", "hit rate 5m"]
    assert s["windows"][0]["promql"] == (
        "rate(vllm:prefix_cache_hits_total[1m]) / rate(vllm:prefix_cache_queries_total[1m])"
    )


# ------------------------------------------------------- the service's side


async def scrape(api: Api) -> dict[str, float]:
    r = await api.get("/metrics")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[s.name] = s.value
    return out


async def test_metrics_rest_and_point_show_running_waiting_and_rates(api: Api) -> None:
    e = api.engine
    clock = Clock()
    e.hit_window = HitWindow(clock=clock)  # counting from 0 now, as at the engine's start
    demo = api.app.state.demo
    demo.waiting.extend([demo._new_request(), demo._new_request()])  # arrived, not admitted
    tokens = list(range(100, 118))  # 4 full blocks of 4 + 2
    await api.admit(tokens, request_id="a")
    e.point()  # the first sample: 18 queried, 0 hits
    await api.admit(tokens, request_id="b")  # 16 of 18 tokens hit
    # the clock moves only now: a stream tick during the admit samples at
    # 1000 (skipped, one sample period not over), never at 1001 before "b"
    clock.t += 1.0
    pt = e.point()
    assert pt["requests"] == 2.0 and pt["waiting"] == 2.0
    assert pt["hit_rate_since"] == pytest.approx(16 / 36)
    # the first sample is (0, 18) or, when the engine ticked before "a", (0, 0)
    samples = list(e.hit_window.samples)
    assert [t for t, _, _ in samples] == [1000.0, 1001.0] and samples[1][1:] == (16, 36)
    hs = [(t, float(h)) for t, h, _ in samples]
    qs = [(t, float(q)) for t, _, q in samples]
    want = prom_rate(hs, 1001.0, 60.0) / prom_rate(qs, 1001.0, 60.0)  # type: ignore[operator]
    assert pt["hit_rate_1m"] == pytest.approx(want) and pt["hit_rate_5m"] == pytest.approx(want)

    m = await scrape(api)
    assert m["vllm:num_requests_running"] == 2.0
    assert m["vllm:num_requests_waiting"] == 2.0
    assert m["vllm:prefix_cache_hits_total"] == 16.0
    assert m["vllm:prefix_cache_queries_total"] == 36.0
    usage = m["vllm:kv_cache_usage_perc"]

    r: dict[str, Any] = await api.ok("GET", "/api/pool/rates")
    assert r["usage"] == usage and 0.0 < r["usage"] <= 1.0
    assert r["requests_running"] == 2 and r["requests_waiting"] == 2
    assert [w["hit_rate"] for w in r["windows"]] == [pytest.approx(want)] * 2
    assert r["since_start"]["label"] == "since start"
    assert r["since_start"]["hit_rate"] == pytest.approx(16 / 36)

    series = await api.ok("GET", "/api/series", params={"limit": 5})
    last = series["points"][-1]
    for key in ("hit_rate_1m", "hit_rate_5m", "hit_rate_since", "waiting", "usage"):
        assert key in last, key
    demo.waiting.clear()
    await api.finish("a")
    await api.finish("b")
    m = await scrape(api)
    assert m["vllm:num_requests_running"] == 0.0 and m["vllm:num_requests_waiting"] == 0.0
    api.check()


async def test_a_prefix_cache_reset_restarts_the_figures_not_the_counters(api: Api) -> None:
    e = api.engine
    clock = Clock()
    e.hit_window = HitWindow(clock=clock)
    tokens = list(range(200, 218))
    await api.admit(tokens, request_id="a")
    await api.finish("a")
    await api.admit(tokens, request_id="b")  # 16 of 18 hit
    await api.finish("b")
    e.point()
    before = await api.ok("GET", "/api/pool/rates")
    assert before["since_start"]["hit_rate"] == pytest.approx(16 / 36) and before["restarts"] == 0
    await api.ok("POST", "/api/pool/reset")
    clock.t += 1.0
    pt = e.point()
    assert math.isnan(pt["hit_rate_1m"]) and math.isnan(pt["hit_rate_since"])
    r = await api.ok("GET", "/api/pool/rates")
    assert r["restarts"] == 1 and r["since_start"]["label"] == "since reset"
    assert r["since_start"]["queries_tokens"] == 0 and r["windows"][0]["hit_rate"] is None
    m = await scrape(api)
    assert m["vllm:prefix_cache_queries_total"] == 36.0  # the counters go on
    await api.admit(tokens, request_id="c")  # cold again after the reset: 0 of 18
    clock.t += 1.0
    pt = e.point()
    assert pt["hit_rate_since"] == 0.0 and pt["hit_rate_1m"] == 0.0
    await api.finish("c")
    api.check()
