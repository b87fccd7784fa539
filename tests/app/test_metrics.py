"""/metrics: vLLM's names and buckets, our own under blockpool_, values that
agree with /api/summary and /api/samples after a known sequence."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from blockpool.runtime.counters import RESIDENCY_BUCKETS
from tests.app.conftest import Api

pytestmark = pytest.mark.anyio

VLLM_BUCKETS = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5,
    10, 20, 30, 60, 120, 300, 600, 1200, 1800,
]  # fmt: skip


async def scrape(api: Api) -> dict[str, list[tuple[dict[str, str], float]]]:
    r = await api.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(m: dict[str, Any], name: str, **labels: str) -> float:
    hits = [v for lab, v in m[name] if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, m.get(name))
    return float(hits[0])


async def known_sequence(api: Api) -> None:
    first = await api.allocate(63)
    await api.cache(first[:2], list(range(8)))
    await api.ok("POST", "/api/pool/touch", {"block_ids": first[:3]})
    await api.free(first[:3])
    await api.free(first[::-1])
    await api.allocate(63)  # all 63 re-allocated: 63 eviction samples, 2 BlockRemoved
    await api.free(list(range(1, 64)))
    a = await api.admit(list(range(100, 118)), request_id="a")  # 4 full blocks + 2
    b = await api.admit(list(range(100, 118)), request_id="b")  # hits 4 blocks
    assert a["num_hit_blocks"] == 0 and b["num_hit_blocks"] == 4
    await api.finish("a")
    await api.admit([7] * 9, request_id="c")  # 2 full blocks cached + 1
    await api.finish("c")


@pytest.mark.app_settings(metrics_sample_rate=1.0, model_name="m1")
async def test_metrics_agree_with_the_api(api: Api) -> None:
    await known_sequence(api)
    m = await scrape(api)
    s = await api.summary()
    lab = {"model_name": "m1", "engine": "0"}

    assert one(m, "vllm:kv_cache_usage_perc", **lab) == pytest.approx(s["usage"])
    assert s["usage"] == pytest.approx(5 / 63)
    stats = api.engine.manager.stats
    assert one(m, "vllm:prefix_cache_queries_total", **lab) == stats.queries == 18 + 18 + 9
    assert one(m, "vllm:prefix_cache_hits_total", **lab) == stats.hits == 16
    assert s["prefix_cache"]["queries_tokens"] == 45 and s["prefix_cache"]["hits_tokens"] == 16
    assert one(m, "vllm:num_requests_running", **lab) == 1

    [(info, value)] = m["vllm:cache_config_info"]
    assert value == 1
    assert info == {
        "block_size": "4",
        "num_gpu_blocks": "64",
        "enable_prefix_caching": "True",
        "prefix_caching_hash_algo": "sha256",
        "kv_cache_metrics_sample": "1.0",
        "engine": "0",
        "model_name": "m1",
    }

    samples = await api.ok("GET", "/api/samples")
    for name, key in [
        ("vllm:kv_block_lifetime_seconds", "lifetime"),
        ("vllm:kv_block_idle_before_evict_seconds", "idle"),
        ("vllm:kv_block_reuse_gap_seconds", "reuse_gap"),
    ]:
        buckets = [(lab_["le"], v) for lab_, v in m[f"{name}_bucket"]]
        assert [le for le, _ in buckets] == [*(str(float(b)) for b in VLLM_BUCKETS), "+Inf"]
        counts = [v for _, v in buckets]
        assert counts == sorted(counts)
        h = samples["histograms"][key]
        assert counts == h["cumulative_counts"]
        assert one(m, f"{name}_count", **lab) == h["count"] == counts[-1]
        assert one(m, f"{name}_sum", **lab) == pytest.approx(h["sum"])
    # every re-allocated block gives one sample: 63, then a's 5, b's 1, c's 3
    assert one(m, "vllm:kv_block_lifetime_seconds_count", **lab) == 63 + 5 + 1 + 3
    assert one(m, "vllm:kv_block_reuse_gap_seconds_count", **lab) == 0  # one access each: no gap

    for state, n in s["blocks"].items():
        assert one(m, "blockpool_blocks", state=state) == n
    assert s["blocks"] == {"null": 1, "in_use": 5, "cached": 2, "empty": 56}
    c = s["counters"]
    assert one(m, "blockpool_evictions_total") == c["evictions"] == 2
    assert one(m, "blockpool_blocks_allocated_total") == c["blocks_allocated"]
    assert c["blocks_allocated"] == 63 + 63 + 5 + 1 + 3
    assert one(m, "blockpool_blocks_freed_total") == c["blocks_freed"]
    assert one(m, "blockpool_blocks_cached_total") == c["blocks_cached"]
    assert one(m, "blockpool_requests_admitted_total") == 3
    assert one(m, "blockpool_requests_finished_total") == 2
    assert one(m, "blockpool_free_blocks") == s["num_free_blocks"] == 58
    assert one(m, "blockpool_hash_map_keys") == s["hash_map_keys"]
    assert one(m, "blockpool_eviction_samples_total") == samples["last_seq"]
    for ev_type, n in c["events"].items():
        assert one(m, "blockpool_kv_events_total", type=ev_type) == n
    assert tuple(VLLM_BUCKETS) == RESIDENCY_BUCKETS
    api.check()


async def test_refusals_and_resets_are_counted(api: Api) -> None:
    await api.allocate(2)
    assert (await api.post("/api/pool/reset")).status_code == 409
    assert (await api.post("/api/pool/allocate", {"num_blocks": 99})).status_code == 409
    assert (await api.post("/api/requests", {"token_ids": list(range(999))})).status_code == 409
    await api.free([1, 2])
    assert (await api.post("/api/pool/reset")).status_code == 200
    m = await scrape(api)
    assert one(m, "blockpool_resets_total") == 1
    assert one(m, "blockpool_resets_refused_total") == 1
    assert one(m, "blockpool_requests_refused_total") == 1
    assert one(m, "blockpool_operations_refused_total") == 3
    assert one(m, "blockpool_operations_total") == api.engine.counters.ops == 6
    assert one(m, "blockpool_kv_events_total", type="AllBlocksCleared") == 1
    assert one(m, "blockpool_event_log_dropped_total") == 0
    api.check()


async def test_metrics_have_no_id_labels(api: Api) -> None:
    await api.admit(list(range(20)), request_id="secret-req")
    r = await api.get("/metrics")
    assert "secret-req" not in r.text
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            assert not {"block_id", "request_id"} & set(s.labels)
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name
    api.check()


@pytest.mark.app_settings(event_log_capacity=100, tick_hz=0.01)  # ticks only here
async def test_events_pushed_out_of_the_log_before_a_tick_are_counted(api: Api) -> None:
    bs = api.engine.settings.block_size

    async def store_then_evict(first_token: int) -> None:
        """63 blocks cached (1 BlockStored), freed, re-allocated (63 BlockRemoved)."""
        ids = await api.allocate(63)
        await api.cache(ids, list(range(first_token, first_token + 63 * bs)))
        await api.free(ids)
        await api.allocate(63)
        await api.free(list(range(1, 64)))

    await store_then_evict(0)
    data = api.engine.tick()  # 64 events since the start, all still held
    assert data.events_lost == 0 and len(data.events) == 64
    await store_then_evict(10_000)
    await store_then_evict(20_000)  # 128 events since that tick: 28 already gone
    data = api.engine.tick()
    assert data.events_lost == 28 and len(data.events) == 100
    assert [s for s, _, _ in data.events] == list(range(93, 193))
    s = await api.summary()
    assert s["event_log"]["lost_before_tick"] == 28
    m = await scrape(api)
    assert one(m, "blockpool_event_log_lost_before_tick_total") == 28
    assert one(m, "blockpool_event_log_dropped_total") == s["event_log"]["dropped"] == 92
    api.check()


async def test_the_stream_and_demo_figures_carry_their_help(api: Api) -> None:
    from app.pool.demo import DEMO_HELP
    from app.stream.hub import STREAM_HELP
    from app.trace.driver import TRACE_HELP

    r = await api.get("/metrics")
    text = r.text
    for part, helps in (("stream", STREAM_HELP), ("demo", DEMO_HELP), ("trace", TRACE_HELP)):
        for key, doc in helps.items():
            name = f"blockpool_{part}_{key}"
            if key.endswith("_total"):
                name = name[: -len("_total")] + "_total"
            assert f"# HELP {name} {doc}" in text, name
    # REST reads the same figures
    stats = api.app.state.stream.stats()
    assert {k for k in stats if k.endswith("_total")} == {
        k for k in STREAM_HELP if k.endswith("_total") and k != "ring_variants_made_total"
    }
