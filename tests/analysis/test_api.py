"""The analysis REST endpoints: shapes, the one error shape, nothing changed."""

from __future__ import annotations

import json

import pytest

from blockpool.analysis import replay
from blockpool.runtime.state import digest
from tests.app.conftest import Api, assert_error

pytestmark = pytest.mark.anyio

A = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]  # bs 4: two full blocks + 2 tokens


async def _traffic(api: Api) -> None:
    await api.admit(A, request_id="a")
    await api.finish("a")
    await api.admit(A, request_id="b")  # hits block 0 and 1; partial tail
    await api.admit([7] * 9, request_id="c", cache_salt="x")


async def test_request_detail_has_a_reason_per_block(aapi: Api) -> None:
    await _traffic(aapi)
    d = await aapi.ok("GET", "/api/requests/c")
    assert [b["reason"] for b in d["blocks"]] == ["cold", "cold", "block_size_floor"]
    assert d["blocks"][2]["miss"] == {"partial": True, "tokens": 1}
    assert d["misses"] == {"cold": 2, "block_size_floor": 1}
    d = await aapi.ok("GET", "/api/requests/b")
    assert [b["reason"] for b in d["blocks"]] == [None, None, "block_size_floor"]
    assert [b["hit"] for b in d["blocks"]] == [True, True, False]


async def test_misses_aggregate_and_finished_requests(aapi: Api) -> None:
    await _traffic(aapi)
    body = await aapi.ok("GET", "/api/misses", params={"limit": 10})
    assert body["admissions"] == 3
    assert body["hit"] == {"blocks": 2, "tokens": 8}
    assert body["reasons"]["cold"]["blocks"] == 4  # a's two, c's two
    assert body["reasons"]["block_size_floor"] == {"blocks": 3, "tokens": 5, "share": 3 / 7}
    assert [r["request_id"] for r in body["recent_requests"]] == ["c", "b", "a"]
    assert body["recent_requests"][2]["finished"] is True
    one = await aapi.ok("GET", "/api/misses/requests/a")  # finished: still there
    assert one["finished"] is True and [b["reason"] for b in one["blocks"]] == [
        "cold", "cold", "block_size_floor",
    ]  # fmt: skip
    assert_error(await aapi.get("/api/requests/a"), 404)  # the running-request view
    err = assert_error(await aapi.get("/api/misses/requests/ghost"), 404, "not_found")
    assert err["details"] == {"request_id": "ghost"}


async def test_regret_and_shadows(aapi: Api) -> None:
    await _traffic(aapi)
    aapi.engine.tick()
    r = await aapi.ok("GET", "/api/regret")
    assert r["regrets_total"] == 0 and r["top_prefixes"] == [] and "gap_seconds" in r
    s = await aapi.ok("GET", "/api/shadows")
    names = [x["name"] for x in s["shadows"]]
    assert names == [
        "append_all@0.5x", "append_all@1x", "append_all@2x", "append_all@4x",
        "uncached_first@1x", "s3fifo@1x",
    ]  # fmt: skip
    one = s["shadows"][1]
    assert one["hits"] == s["real"]["hits_tokens"] == 8
    assert s["real"]["span"]["hit_rate"] == one["hit_rate"]
    assert [p["factor"] for p in s["curve"]["append_all"]] == [0.5, 1.0, 2.0, 4.0]
    assert s["mode"] == "inline" and s["error"] is None


async def test_history_state_diff_export(aapi: Api) -> None:
    await _traffic(aapi)
    info = await aapi.ok("GET", "/api/history")
    assert info["first_seq"] == 0 and info["last_seq"] == 4
    st = await aapi.ok("GET", "/api/history/state", params={"at": "1", "include_blocks": True})
    assert st["at"]["seq"] == 1 and st["replay_mismatches"] == 0
    assert st["summary"]["running_requests"] == 1
    assert st["requests"]["items"][0]["block_ids"] == [[1, 2, 3]]
    assert st["blocks"]["state"][:4] == ["null", "in_use", "in_use", "in_use"]
    assert st["queue"]["block_ids"][:2] == [4, 5]
    d = await aapi.ok("GET", "/api/history/diff", params={"from": "1", "to": "2"})
    assert d["requests"] == {"started": [], "ended": ["a"], "running_from": 1, "running_to": 0}
    assert d["ops"]["by_type"] == {"finish": 1}
    r = await aapi.get("/api/history/export")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert [x["type"] for x in lines] == ["header", "keyframe", "op", "op", "op", "op", "final"]
    assert "token" not in lines[0]["settings"]
    report, end = replay.replay_records(lines)
    assert report.ok and digest(end) == digest(aapi.engine.runtime)


async def test_export_compressed_and_its_size_from_counters(aapi: Api) -> None:
    import gzip

    await _traffic(aapi)
    plain = await aapi.get("/api/history/export", headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers
    r = await aapi.get("/api/history/export", headers={"accept-encoding": "br;q=1, gzip;q=0.5"})
    assert r.headers["content-encoding"] == "gzip" and r.headers["vary"] == "Accept-Encoding"
    # httpx undoes the Content-Encoding: the same lines (the times aside)
    assert r.text.splitlines()[1:-1] == plain.text.splitlines()[1:-1]
    f = await aapi.get("/api/history/export.jsonl.gz")
    assert f.headers["content-type"] == "application/gzip"
    assert 'filename="blockpool-recording-' in f.headers["content-disposition"]
    assert gzip.decompress(f.content).decode().splitlines()[1:-1] == plain.text.splitlines()[1:-1]
    size = await aapi.ok("GET", "/api/history/export/size")
    assert size["lines"] == len(plain.text.splitlines()) and size["estimated"] is True
    assert abs(size["bytes"] - len(plain.content)) <= 0.25 * len(plain.content)
    info = await aapi.ok("GET", "/api/history")
    assert info["horizon"]["full"] is False and info["horizon"]["seconds"] is not None


async def test_bad_input_changes_nothing(aapi: Api) -> None:
    await _traffic(aapi)
    before = aapi.fingerprint()
    for params, status, code in (
        ({"at": "yesterday"}, 422, "invalid_input"),
        ({"at": "2.5"}, 422, "invalid_input"),
        ({"at": "99"}, 404, "not_found"),
        ({"at": "1", "limit": 0}, 422, "invalid_input"),
        ({}, 422, "invalid_input"),
    ):
        assert_error(await aapi.get("/api/history/state", params=params), status, code)
    err = assert_error(
        await aapi.get("/api/history/diff", params={"from": "3", "to": "1"}), 422, "invalid_input"
    )
    assert err["details"] == {"from_seq": 3, "to_seq": 1}
    assert_error(await aapi.get("/api/misses", params={"limit": "x"}), 422)
    assert_error(await aapi.get("/api/regret", params={"limit": 10**6}), 422)
    assert_error(await aapi.post("/api/misses"), 405)
    assert aapi.fingerprint() == before
    aapi.check()


@pytest.mark.app_settings(analysis=False)
async def test_analysis_off(aapi: Api) -> None:
    await _traffic(aapi)
    for url in ("/api/misses", "/api/regret", "/api/shadows", "/api/history",
                "/api/history/export", "/api/misses/requests/a"):  # fmt: skip
        assert_error(await aapi.get(url), 409, "conflict", contains="analysis is off")
    d = await aapi.ok("GET", "/api/requests/b")
    assert [b["reason"] for b in d["blocks"]] == [None, None, None]
    assert (await aapi.summary())["tokens"]["held"] == 19


@pytest.mark.app_settings(recording=False, shadow_mode="off")
async def test_recording_off(aapi: Api) -> None:
    await _traffic(aapi)
    assert_error(await aapi.get("/api/history"), 409, contains="recording is off")
    s = await aapi.ok("GET", "/api/shadows")
    assert s["enabled"] is False and s["shadows"] == []
    assert (await aapi.ok("GET", "/api/misses"))["admissions"] == 3


async def test_token_usage(aapi: Api) -> None:
    t = (await aapi.summary())["tokens"]
    assert t == {
        "held": 0, "slots_reserved": 0, "tail_waste": 0, "capacity": 63 * 4,
        "usage_ratio": 0.0, "fill_ratio": 1.0, "reason": None,
    }  # fmt: skip
    await aapi.admit(A, request_id="a")  # 10 tokens in 3 blocks of 4
    t = (await aapi.summary())["tokens"]
    assert (t["held"], t["slots_reserved"], t["tail_waste"]) == (10, 12, 2)
    await aapi.ok("POST", "/api/requests/a/tokens", {"token_ids": [1, 2, 3]})  # 13 in 4
    await aapi.admit(A[:8], request_id="b")  # shares block 0; block 1 recomputed
    t = (await aapi.summary())["tokens"]
    assert (t["held"], t["slots_reserved"]) == (13 + 4, 20)
    assert t["fill_ratio"] == 17 / 20 and t["usage_ratio"] == 17 / 252
    await aapi.allocate(2)  # raw blocks count as full
    t = (await aapi.summary())["tokens"]
    assert (t["held"], t["slots_reserved"]) == (25, 28)
    await aapi.finish("a")
    await aapi.finish("b")
    t = (await aapi.summary())["tokens"]
    assert (t["held"], t["tail_waste"]) == (8, 0)


async def test_metrics(aapi: Api) -> None:
    await _traffic(aapi)
    aapi.engine.tick()
    r = await aapi.get("/metrics")
    text = r.text
    for line in (
        'blockpool_prefix_misses_total{reason="cold"} 4.0',
        'blockpool_prefix_misses_total{reason="block_size_floor"} 3.0',
        'blockpool_prefix_miss_tokens_total{reason="block_size_floor"} 5.0',
        "blockpool_prefix_hit_blocks_total 2.0",
        "blockpool_eviction_regrets_total 0.0",
        'blockpool_eviction_regret_gap_seconds_bucket{le="+Inf"} 0.0',
        'blockpool_shadow_hit_ratio{capacity_factor="1",policy="append_all"}',
        'blockpool_shadow_capacity_blocks{capacity_factor="0.5",policy="append_all"} 32.0',
        "blockpool_token_usage_ratio",
        "blockpool_tokens_held 19.0",
        "blockpool_token_slots_reserved 24.0",
        "blockpool_recording_ops 4.0",
        'blockpool_evictions_by_cause_total{cause="reuse"} 0.0',
    ):
        assert line in text, line
