"""Replaying a trace on the live engine: upload (validated whole), start, stop,
progress and the trace's own hit rate; ``serve --trace`` starts it instead of
the demo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.app.conftest import Api, assert_error, make_app, running
from tests.support.wait import eventually_async

pytestmark = pytest.mark.anyio

# 4 tokens per id, 4-token blocks: every request shares its first 2 ids with the last
ROWS = [
    {"timestamp": i * 5, "input_length": 14, "output_length": 6, "hash_ids": [1, 2, 10 + i, 50 + i]}
    for i in range(12)
]
BODY = "\n".join(json.dumps(r) for r in ROWS) + "\n"
UPLOAD = "/api/trace/upload?tokens_per_id=4&name=small"


async def _wait(api: Api, pred: Any, timeout: float = 60.0) -> dict[str, Any]:
    async def seen() -> dict[str, Any] | None:
        s = await api.ok("GET", "/api/trace")
        return s if pred(s) else None

    found: dict[str, Any] = await eventually_async(seen, timeout, "the trace status to match")
    return found


async def test_upload_start_run_to_the_end(api: Api) -> None:
    status = await api.ok("GET", "/api/trace")
    assert status["loaded"] is False and status["running"] is False
    assert_error(await api.post("/api/trace/start"), 409, contains="no trace loaded")
    r = await api.client.post(UPLOAD, content=BODY)
    assert r.status_code == 200, r.text
    loaded = r.json()
    assert (loaded["loaded"], loaded["name"], loaded["requests"]) == (True, "small", 12)
    started = await api.ok("POST", "/api/trace/start?speed=20")
    assert started["running"] is True and started["speed"] == 20
    done = await _wait(api, lambda s: s["stats"]["finished"] == 12 and not s["running"])
    stats = done["stats"]
    assert (stats["arrived"], stats["admitted"], stats["refused"]) == (12, 12, 0)
    assert stats["prompt_tokens"] == 12 * 14
    # the first request misses; each later one hits ids 1, 2 (2 blocks of 4 tokens)
    assert stats["hit_tokens"] == 11 * 8
    assert stats["hit_rate"] == pytest.approx(88 / 168)
    assert done["progress"] == 1.0 and done["requests_running"] == 0
    assert api.engine.manager.requests == {}
    # /metrics reads the same figures
    text = (await api.get("/metrics")).text
    figures = {"requests_arrived": 12, "requests_finished": 12, "hit_tokens": 88,
               "prompt_tokens": 168, "preemptions": 0}  # fmt: skip
    for name, value in figures.items():
        assert f"blockpool_trace_{name}_total {float(value)}" in text, name


async def test_the_bound_for_the_what_if_panel(api: Api) -> None:
    r = await api.client.post(UPLOAD, content=BODY)
    assert r.status_code == 200, r.text
    s = await _wait(api, lambda s: s["bound"] is not None)
    b = s["bound"]
    pool = api.engine.pool
    assert b["model"] == "sequence" and b["blocks"] == pool.num_gpu_blocks
    assert b["prompt_tokens"] == 12 * 14
    # a big pool: nothing is evicted, so LRU, the optimum and unbounded agree
    # (each later request hits ids 1, 2: 8 tokens)
    assert b["lru_hit_rate"] == b["optimal_hit_rate"] == b["unbounded_hit_rate"]
    assert b["unbounded_hit_rate"] == pytest.approx(88 / 168)


@pytest.mark.app_settings(max_tokens_per_request=3000)
async def test_a_bad_upload_changes_nothing(api: Api) -> None:
    bad = BODY + json.dumps({"timestamp": 99, "input_length": 30, "hash_ids": [1]}) + "\n"
    err = assert_error(await api.client.post(UPLOAD, content=bad), 422, "invalid_input")
    assert err["details"]["line"] == 13 and "line 13" in err["message"]
    assert (await api.ok("GET", "/api/trace"))["loaded"] is False
    huge = json.dumps({"timestamp": 0, "input_length": 4000, "output_length": 1,
                       "hash_ids": list(range(1000))})  # fmt: skip
    err = assert_error(await api.client.post(UPLOAD, content=huge), 422, "invalid_input")
    assert "max_tokens_per_request" in err["message"]
    assert (await api.ok("GET", "/api/trace"))["loaded"] is False
    err = assert_error(await api.client.post(UPLOAD, content=b"\xff\xfe"), 422)
    assert "UTF-8" in err["message"]


async def test_uploads_are_bounded(api: Api) -> None:
    over = "\n" * (9 * 1024 * 1024)  # past the default 8 MiB body limit
    assert_error(await api.client.post(UPLOAD, content=over), 413, "too_large")


@pytest.mark.app_settings(token="s3cret")
async def test_writes_need_the_token(api: Api) -> None:
    assert_error(await api.client.post(UPLOAD, content=BODY), 401)
    assert_error(await api.post("/api/trace/start"), 401)
    auth = {"Authorization": "Bearer s3cret"}
    r = await api.client.post(UPLOAD, content=BODY, headers=auth)
    assert r.status_code == 200
    assert (await api.client.post("/api/trace/stop", headers=auth)).status_code == 200


async def test_not_while_the_demo_runs(api: Api) -> None:
    assert (await api.client.post(UPLOAD, content=BODY)).status_code == 200
    await api.ok("POST", "/api/demo/start")
    assert_error(await api.post("/api/trace/start"), 409, contains="demo")
    await api.ok("POST", "/api/demo/stop")
    await api.ok("POST", "/api/trace/start?speed=50")
    assert_error(await api.client.post(UPLOAD, content=BODY), 409, contains="stop it first")
    stopped = await api.ok("POST", "/api/trace/stop")
    assert stopped["running"] is False and stopped["requests_running"] == 0


async def test_serve_trace_starts_it_instead_of_the_demo(tmp_path: Path) -> None:
    rows = [{**r, "input_length": 1000, "hash_ids": [1, 2]} for r in ROWS]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    app = make_app(trace=str(p), trace_speed=50.0, trace_loop=True, demo=True,
                   num_blocks=2048, block_size=16)  # fmt: skip
    async with running(app) as api:
        s = await _wait(api, lambda s: s["stats"]["loops"] >= 1)
        assert s["name"] == "t.jsonl" and s["loop"] is True and s["requests"] == 12
        assert (await api.ok("GET", "/api/demo"))["running"] is False
        assert s["stats"]["hit_tokens"] > 0
        await api.ok("POST", "/api/trace/stop")
        api.check()
    app.state.engine.check()
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match="line 1"):
        make_app(trace=str(tmp_path / "bad.jsonl"))
