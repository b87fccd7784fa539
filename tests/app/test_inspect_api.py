"""Looking inside: one block, the queue (paged), the hash map (paged, searched),
the event log (seq, truncation), eviction samples, the time series."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.app.conftest import Api, assert_error

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------ blocks


async def test_block_detail_for_request_and_free_blocks(api: Api) -> None:
    a = await api.admit(list(range(10)), request_id="alpha")
    b = await api.admit([*range(8), 40, 41], request_id="beta")
    assert a["block_ids"] == [[1, 2, 3]] and b["block_ids"] == [[1, 2, 4]]
    shared = await api.ok("GET", "/api/blocks/1")
    mgr = api.engine.manager
    assert shared == {
        "block_id": 1,
        "state": "in_use",
        "ref_cnt": 2,
        "is_null": False,
        "raw_refs": 0,
        "requests": ["alpha", "beta"],
        "block_hash": mgr.requests["alpha"].block_hashes[0].hex(),
        "hash64": mgr.requests["alpha"].block_hashes[0][-8:].hex(),
        "group_id": 0,
        "copies_under_hash": 1,
        "queue_position": None,
        "queue_stamp": shared["queue_stamp"],
        "metrics": None,
    }
    tail = await api.ok("GET", "/api/blocks/3")
    assert tail["requests"] == ["alpha"] and tail["block_hash"] is None  # partial block
    await api.finish("alpha")
    q = await api.queue()
    assert q[-1] == 3
    tail = await api.ok("GET", "/api/blocks/3")
    assert tail["state"] == "empty" and tail["queue_position"] == len(q) - 1
    assert tail["requests"] == []
    first = await api.ok("GET", f"/api/blocks/{q[0]}")
    assert first["queue_position"] == 0
    null = await api.ok("GET", "/api/blocks/0")
    assert null["state"] == "null" and null["is_null"] is True and null["ref_cnt"] == 0
    assert null["queue_position"] is None
    api.check()


async def test_block_out_of_range(api: Api) -> None:
    err = assert_error(await api.get("/api/blocks/64"), 404, "not_found")
    assert err["details"] == {"block_id": 64}
    assert_error(await api.get("/api/blocks/-1"), 422, "invalid_input")
    assert_error(await api.get("/api/blocks/abc"), 422, "invalid_input")


@pytest.mark.app_settings(metrics_sample_rate=1.0)
async def test_block_detail_shows_sampled_metrics(api: Api) -> None:
    [bid] = await api.allocate(1)
    m = (await api.ok("GET", f"/api/blocks/{bid}"))["metrics"]
    assert m["sampled"] is True
    assert m["age_seconds"] >= 0 and m["idle_seconds"] >= 0
    assert m["accesses_kept"] == 0  # allocation is not an access (vLLM)
    for n in range(1, 6):
        await api.ok("POST", "/api/pool/touch", {"block_ids": [bid]})
        m = (await api.ok("GET", f"/api/blocks/{bid}"))["metrics"]
        assert m["accesses_kept"] == min(n, 4)
        assert len(m["reuse_gaps_seconds"]) == min(n, 4) - 1
    api.check()


# ------------------------------------------------------------ queue


async def test_queue_paging(api: Api) -> None:
    await api.allocate(10)
    await api.free([7, 3, 9])
    order = [*range(11, 64), 7, 3, 9]
    page = await api.ok("GET", "/api/queue", params={"offset": 0, "limit": 5})
    assert page["total"] == 56 and page["offset"] == 0 and page["limit"] == 5
    assert [i["block_id"] for i in page["items"]] == order[:5]
    assert [i["position"] for i in page["items"]] == [0, 1, 2, 3, 4]
    page = await api.ok("GET", "/api/queue", params={"offset": 50, "limit": 100})
    assert [i["block_id"] for i in page["items"]] == order[50:]
    assert [i["position"] for i in page["items"]] == list(range(50, 56))
    page = await api.ok("GET", "/api/queue", params={"offset": 500})
    assert page["items"] == [] and page["total"] == 56
    got: list[int] = []
    for off in range(0, 56, 7):
        page = await api.ok("GET", "/api/queue", params={"offset": off, "limit": 7})
        got += [i["block_id"] for i in page["items"]]
    assert got == order == api.pool_queue()
    assert_error(await api.get("/api/queue", params={"limit": 0}), 422)
    assert_error(await api.get("/api/queue", params={"offset": -1}), 422)
    api.check()


async def test_queue_marks_cached_blocks(api: Api) -> None:
    ids = await api.allocate(2)
    [hx, _] = await api.cache(ids, list(range(8)))
    await api.free(ids[::-1])
    page = await api.ok("GET", "/api/queue", params={"offset": 61})
    assert page["cached"] == 2
    assert page["items"] == [
        {"position": 61, "block_id": 2, "cached": True, "hash64": page["items"][0]["hash64"]},
        {"position": 62, "block_id": 1, "cached": True, "hash64": hx[-16:]},
    ]
    api.check()


# ------------------------------------------------------------ hash map


async def test_hashmap_paging_search_and_multi(api: Api) -> None:
    ids = await api.allocate(6)
    h_a = await api.cache(ids[0:2], list(range(8)))
    await api.cache([ids[2]], list(range(4)))  # a second copy of h_a[0]
    h_c = await api.cache(ids[3:5], list(range(50, 58)))
    page = await api.ok("GET", "/api/hashmap", params={"limit": 2})
    assert page["total_keys"] == 4 and page["matched"] == 4 and page["matched_multi"] == 1
    assert len(page["items"]) == 2
    everything = (await api.ok("GET", "/api/hashmap"))["items"]
    assert {i["block_hash"] for i in everything} == {*h_a, *h_c}
    rest = (await api.ok("GET", "/api/hashmap", params={"offset": 2}))["items"]
    assert page["items"] + rest == everything

    multi = await api.ok("GET", "/api/hashmap", params={"multi_only": True})
    assert multi["matched"] == 1
    [item] = multi["items"]
    assert item == {
        "block_hash": h_a[0],
        "hash64": h_a[0][-16:],
        "group_id": 0,
        "block_ids": [ids[0], ids[2]],
        "multi": True,
    }
    blk = await api.ok("GET", f"/api/blocks/{ids[2]}")
    assert blk["copies_under_hash"] == 2

    by_prefix = await api.ok("GET", "/api/hashmap", params={"hash": h_c[1][:6].upper()})
    assert [i["block_ids"] for i in by_prefix["items"]] == [[ids[4]]]
    by_h64 = await api.ok("GET", "/api/hashmap", params={"hash": h_c[0][-16:-6]})
    assert [i["block_ids"] for i in by_h64["items"]] == [[ids[3]]]
    by_block = await api.ok("GET", "/api/hashmap", params={"block_id": ids[2]})
    assert [i["block_ids"] for i in by_block["items"]] == [[ids[0], ids[2]]]
    none = await api.ok("GET", "/api/hashmap", params={"block_id": ids[5]})
    assert none["items"] == [] and none["matched"] == 0
    assert_error(await api.get("/api/hashmap", params={"block_id": 64}), 422)
    assert_error(await api.get("/api/hashmap", params={"hash": "xyz"}), 422)
    api.check()


# ------------------------------------------------------------ events


async def test_events_are_sequenced_and_filterable(api: Api) -> None:
    ids = await api.allocate(2)
    await api.cache(ids, list(range(8)))
    await api.ok("POST", "/api/pool/evict", {"block_ids": ids})
    await api.free(ids)
    await api.ok("POST", "/api/pool/reset")
    body = await api.ok("GET", "/api/events")
    assert [(e["seq"], e["type"]) for e in body["items"]] == [
        (1, "BlockStored"),
        (2, "BlockRemoved"),
        (3, "BlockRemoved"),
        (4, "AllBlocksCleared"),
    ]
    assert body["last_seq"] == 4 and body["first_seq"] == 1 and body["next"] == 4
    assert body["truncated"] is False and body["dropped_total"] == 0
    since = await api.ok("GET", "/api/events", params={"since": 2})
    assert [e["seq"] for e in since["items"]] == [3, 4]
    page = await api.ok("GET", "/api/events", params={"since": 0, "limit": 2})
    assert [e["seq"] for e in page["items"]] == [1, 2] and page["next"] == 2
    only = await api.ok("GET", "/api/events", params={"type": ["BlockRemoved"]})
    assert [e["seq"] for e in only["items"]] == [2, 3]
    later = await api.ok("GET", "/api/events", params={"since": 4})
    assert later["items"] == [] and later["next"] == 4
    ts = [e["ts"] for e in body["items"]]
    assert ts == sorted(ts)
    assert_error(await api.get("/api/events", params={"since": -1}), 422)
    err = assert_error(await api.get("/api/events", params={"type": "BlockEvicted"}), 422)
    assert "BlockStored" in err["message"]  # says which types exist
    far = await api.ok("GET", "/api/events", params={"since": 2**53})
    assert far["items"] == [] and far["truncated"] is False
    assert_error(await api.get("/api/events", params={"since": 2**63}), 422)  # was a 500
    assert_error(await api.get("/api/samples", params={"since": 2**63}), 422)
    api.check()


@pytest.mark.app_settings(event_log_capacity=100)
async def test_event_log_truncation(api: Api) -> None:
    ids = await api.allocate(1)
    ops = []
    for i in range(60):  # 120 events: 60 BlockStored + 60 BlockRemoved
        ops.append({"op": "cache", "block_ids": ids, "token_ids": [i, i, i, i]})
        ops.append({"op": "evict", "block_ids": ids})
    res = await api.ok("POST", "/api/batch", {"ops": ops})
    assert res["applied"] == 120
    body = await api.ok("GET", "/api/events", params={"since": 0, "limit": 10_000})
    assert body["last_seq"] == 120
    assert body["first_seq"] == 21
    assert body["dropped_total"] == 20
    assert body["truncated"] is True
    assert [e["seq"] for e in body["items"]] == list(range(21, 121))
    ok = await api.ok("GET", "/api/events", params={"since": 20})
    assert ok["truncated"] is False and ok["items"][0]["seq"] == 21
    late = await api.ok("GET", "/api/events", params={"since": 19})
    assert late["truncated"] is True
    api.engine.tick()  # (or the ticker did): the tick saw 100 of the batch's events
    s = await api.summary()
    assert s["event_log"] == {
        "last_seq": 120, "first_seq": 21, "dropped": 20, "lost_before_tick": 20,
    }  # fmt: skip
    assert s["counters"]["events"]["BlockStored"] == 60
    api.check()


# ------------------------------------------------------------ samples, series


@pytest.mark.app_settings(metrics_sample_rate=1.0)
async def test_samples_when_blocks_are_reallocated(api: Api) -> None:
    first = await api.allocate(63)
    for _ in range(2):  # two accesses: one reuse gap each
        await api.ok("POST", "/api/pool/touch", {"block_ids": first[:5]})
        await api.free(first[:5])
    await api.free(first)
    empty = await api.ok("GET", "/api/samples")
    assert empty["items"] == [] and empty["sample_rate"] == 1.0
    await api.allocate(63)  # every block is sampled; re-allocation evicts them
    body = await api.ok("GET", "/api/samples", params={"limit": 10_000})
    assert body["last_seq"] == 63 and len(body["items"]) == 63
    assert [s["seq"] for s in body["items"]] == list(range(1, 64))
    for s in body["items"]:
        # (vLLM reads the clock once for each figure: idle may pass lifetime by a hair)
        assert 0 <= s["idle_seconds"] <= s["lifetime_seconds"] + 0.01 < 60
    gaps = [len(s["reuse_gaps_seconds"]) for s in body["items"]]
    assert sorted(gaps) == [0] * 58 + [1] * 5
    hists = body["histograms"]
    assert hists["lifetime"]["count"] == 63 and hists["idle"]["count"] == 63
    assert hists["reuse_gap"]["count"] == 5
    life = hists["lifetime"]
    assert (
        life["buckets"][0] == 0.001
        and life["buckets"][-2] == 1800
        and life["buckets"][-1] == "+Inf"
    )
    assert life["cumulative_counts"][-1] == 63
    assert life["cumulative_counts"] == sorted(life["cumulative_counts"])
    page = await api.ok("GET", "/api/samples", params={"since": 60})
    assert [s["seq"] for s in page["items"]] == [61, 62, 63] and page["next"] == 63
    api.check()


@pytest.mark.app_settings(tick_hz=100)
async def test_series_points(api: Api) -> None:
    await api.allocate(7)
    await api.admit(list(range(10)))
    # an operation is ticked at once; an idle pool still ticks every 0.5 s
    deadline = time.monotonic() + 15
    while len(api.engine.series) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    body = await api.ok("GET", "/api/series", params={"limit": 2})
    assert body["tick_hz"] == 100
    assert len(body["points"]) == 2
    p = body["points"][-1]
    assert p["in_use"] == 10 and p["empty"] == 53 and p["cached"] == 0
    assert p["usage"] == pytest.approx(10 / 63)
    assert p["requests"] == 1
    assert p["hit_rate_total"] == 0
    assert set(p) >= {"ts", "hit_rate", "alloc_per_s", "evict_per_s"}
    assert_error(await api.get("/api/series", params={"limit": 0}), 422)
    api.check()
