"""GET /api/requests/{id}/story: one request's blocks, hits, misses with
reasons and times, from the running request, the analysis and the recording."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.app.conftest import Api, assert_error, make_app, running

pytestmark = pytest.mark.anyio

A = list(range(100, 118))  # block size 4: four full blocks + 2 tokens


@pytest.fixture
async def sapi() -> AsyncIterator[Api]:
    app = make_app(analysis_mode="inline", shadow_mode="off", storage=False)
    async with running(app) as a:
        yield a
        a.check()


async def story(api: Api, rid: str, **params: Any) -> dict[str, Any]:
    return await api.ok("GET", f"/api/requests/{rid}/story", params=params)


async def traffic(api: Api) -> None:
    await api.admit(A, request_id="a")  # blocks 1..5 from the queue's head
    await api.ok("POST", "/api/requests/a/tokens", {"token_ids": [1, 2, 3]})  # + block 6
    await api.finish("a")  # freed in reverse: queue 7..63, 6, 5, 4, 3, 2, 1
    await api.admit(A, request_id="b")  # hits 1..4, block 7 for the tail


async def test_a_finished_request_from_the_recording_and_the_analysis(sapi: Api) -> None:
    await traffic(sapi)
    s = await story(sapi, "a")
    assert s["state"] == "finished"
    assert [b["block_ids"] for b in s["blocks"]] == [[1], [2], [3], [4], [5], [6]]
    assert [b["kind"] for b in s["blocks"]] == ["prompt"] * 5 + ["decode"]
    assert [b["tokens"] for b in s["blocks"]] == [4, 4, 4, 4, 4, 1]  # 21 tokens
    assert [b["reason"] for b in s["blocks"]] == [
        "cold", "cold", "cold", "cold", "block_size_floor", None,
    ]  # fmt: skip
    assert s["blocks"][4]["detail"] == {"partial": True, "tokens": 2}
    assert [b["hit"] for b in s["blocks"]] == [False] * 6
    assert s["num_hit_blocks"] == 0 and s["hit_tokens"] == 0
    assert s["misses"] == {"cold": 4, "block_size_floor": 1}
    assert s["num_prompt_tokens"] == 18 and s["num_tokens"] == 21
    assert s["decode"] == {"steps": 1, "tokens": 3, "new_blocks": 1}
    tl = s["timeline"]
    assert [(x["op"], x["ok"]) for x in tl] == [("admit", True), ("append", True), ("finish", True)]
    assert tl[0]["block_ids"] == [[1, 2, 3, 4, 5]] and tl[1]["new_block_ids"] == [[6]]
    assert tl[2]["freed_block_ids"] == [[6, 5, 4, 3, 2, 1]]
    assert tl[0]["seq"] < tl[1]["seq"] < tl[2]["seq"]
    t = s["times"]
    assert t["admitted_at"] == tl[0]["ts"] == t["first_attempt_at"]
    assert t["first_decode_at"] == t["last_decode_at"] == tl[1]["ts"]
    assert t["finished_at"] == tl[2]["ts"]
    assert t["admitted_at"] <= t["first_decode_at"] <= t["finished_at"]
    assert s["blocks"][5]["added_at"] == tl[1]["ts"] and s["blocks"][0]["added_at"] == tl[0]["ts"]
    assert s["sources"]["running"] is False and s["sources"]["miss_reasons"] is True
    assert s["sources"]["recording"]["operations_found"] == 3
    assert s["earlier_lives"] == 0 and s["timeline_omitted"] == 0


async def test_a_running_request_is_read_from_the_manager(sapi: Api) -> None:
    await traffic(sapi)
    s = await story(sapi, "b")
    assert s["state"] == "running" and s["sources"]["running"] is True
    assert [b["block_ids"] for b in s["blocks"]] == [[1], [2], [3], [4], [7]]
    assert [b["hit"] for b in s["blocks"]] == [True] * 4 + [False]
    assert [b["reason"] for b in s["blocks"]] == [None] * 4 + ["block_size_floor"]
    assert s["num_hit_blocks"] == 4 and s["hit_tokens"] == 16
    assert s["misses"] == {"block_size_floor": 1}
    assert s["times"]["finished_at"] is None and s["decode"]["steps"] == 0
    await sapi.ok("POST", "/api/requests/b/tokens", {"token_ids": [9, 9, 9]})
    s = await story(sapi, "b")
    assert [b["block_ids"] for b in s["blocks"]][-1] == [8]  # the queue's head after 7
    assert s["blocks"][-1]["kind"] == "decode" and s["decode"]["new_blocks"] == 1
    assert s["blocks"][-1]["added_at"] == s["times"]["first_decode_at"]


async def test_refused_admissions_and_a_reused_id(sapi: Api) -> None:
    await traffic(sapi)
    r = await sapi.post("/api/requests", {"request_id": "c", "token_ids": [5] * 4 * 59})
    assert_error(r, 409, "not_enough_blocks")  # 58 free blocks, b holds 5
    s = await story(sapi, "c")
    assert s["state"] == "refused" and s["admissions_refused"] == 1 and s["blocks"] == []
    assert s["timeline"][0]["error"]["code"] == "not_enough_blocks"
    assert s["sources"]["miss_reasons"] is False
    # "a" again: the story is of its latest life
    await sapi.admit([7] * 9, request_id="a")
    s = await story(sapi, "a")
    assert s["state"] == "running" and s["earlier_lives"] == 1
    assert [x["op"] for x in s["timeline"]] == ["admit"]
    assert [b["reason"] for b in s["blocks"]] == ["cold", "cold", "block_size_floor"]


async def test_unknown_ids_and_bad_input_are_clear_errors(sapi: Api) -> None:
    await traffic(sapi)
    before = sapi.fingerprint()
    err = assert_error(await sapi.get("/api/requests/ghost/story"), 404, "not_found")
    assert err["details"] == {"request_id": "ghost"} and "ghost" in err["message"]
    assert_error(await sapi.get("/api/requests/a/story", params={"limit": 1}), 422)
    assert sapi.fingerprint() == before


async def test_a_long_timeline_keeps_its_ends(sapi: Api) -> None:
    await sapi.admit(A, request_id="d")
    for i in range(8):
        await sapi.ok("POST", "/api/requests/d/tokens", {"token_ids": [i]})
    s = await story(sapi, "d", limit=4)
    assert len(s["timeline"]) == 4 and s["timeline_omitted"] == 5
    assert s["timeline"][0]["op"] == "admit" and s["decode"]["steps"] == 8
    assert s["timeline"][-1]["num_tokens"] == 26


async def test_the_story_in_worker_mode_has_the_replicas_reasons() -> None:
    # the default mode: the reasons come from the analysis worker's replica
    app = make_app(storage=False, shadow_mode="off")
    async with running(app) as api:
        assert api.engine.analysis is not None and api.engine.analysis.remote is not None
        await traffic(api)
        s = await story(api, "a")
        assert s["state"] == "finished" and s["sources"]["miss_reasons"] is True
        assert [b["reason"] for b in s["blocks"]] == [
            "cold", "cold", "cold", "cold", "block_size_floor", None,
        ]  # fmt: skip
        b = await story(api, "b")
        assert [x["block_ids"] for x in b["blocks"]] == [[1], [2], [3], [4], [7]]
        assert [x["reason"] for x in b["blocks"]] == [None] * 4 + ["block_size_floor"]
        api.check()
