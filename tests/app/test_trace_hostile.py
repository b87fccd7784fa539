"""Trace replay against hostile and unlucky clients (loopback, bounded in time):
uploads bounded by the work they imply, admissions in chunks, one workload at
a time with starts and stops that race, bad files refused naming line and
field, an abandoned upload logged in one line."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.pool.schemas import AdmitOp, AppendOp
from app.trace.driver import TraceDriver
from tests.app.conftest import Api, LiveServer, assert_error, make_app

pytestmark = pytest.mark.anyio

HEADER = json.dumps({"type": "header", "format": "blockpool-recording", "version": 1})


def _rows(n: int, input_length: int, tpi: int = 4, ts: float = 0.0, first_id: int = 0) -> str:
    ids = -(-input_length // tpi)
    rows = [
        {"timestamp": ts + i, "input_length": input_length, "output_length": 1,
         "hash_ids": list(range(first_id + i * ids, first_id + (i + 1) * ids))}
        for i in range(n)
    ]  # fmt: skip
    return "\n".join(json.dumps(r) for r in rows) + "\n"


async def _wait(api: Api, pred: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = await api.ok("GET", "/api/trace")
        if pred(s):
            return s
        assert time.monotonic() < deadline, s
        await asyncio.sleep(0.02)


# ------------------------------------------------------ bounded uploads


LIMITED = {"trace_max_requests": 5, "trace_max_tokens": 300, "max_tokens_per_request": 3000}
DAY_MS = 86_400_000


@pytest.mark.app_settings(**LIMITED)
@pytest.mark.parametrize(
    ("body", "tpi", "line", "limit", "setting"),
    [
        (_rows(6, 8), 4, 6, "max_requests", "trace_max_requests"),
        (_rows(5, 80), 4, 4, "max_total_tokens", "trace_max_tokens"),  # 81 tokens a row
        (_rows(1, 280), 4, 1, "num_blocks", None),  # 71 blocks; the pool holds 63
        (_rows(1, 3001), 512, 1, "max_tokens_per_request", "max_tokens_per_request"),
        (_rows(1, 8, ts=31 * DAY_MS), 4, 1, "max_timestamp_ms", None),
    ],
)
async def test_an_upload_past_a_limit_is_refused_naming_it(
    api: Api, body: str, tpi: int, line: int, limit: str, setting: str | None
) -> None:
    before = api.fingerprint()
    r = await api.client.post(f"/api/trace/upload?tokens_per_id={tpi}", content=body)
    err = assert_error(r, 422, "invalid_input", contains=f"line {line}: ")
    assert err["details"]["line"] == line and err["details"]["limit"] == limit, err
    if setting is not None:
        assert setting in err["message"] or err["details"].get("setting") == setting, err
    assert (await api.ok("GET", "/api/trace"))["loaded"] is False
    assert api.fingerprint() == before


async def test_tokens_per_id_is_bounded(api: Api) -> None:
    # 200 one-token rows of ids a million tokens wide stalled the server
    body = "\n".join(
        json.dumps({"timestamp": i, "input_length": 1, "output_length": 1, "hash_ids": [i]})
        for i in range(200)
    )
    r = await api.client.post("/api/trace/upload?tokens_per_id=1048576", content=body)
    err = assert_error(r, 422, "invalid_input")
    assert "tokens_per_id" in err["message"]
    assert (await api.ok("GET", "/api/trace"))["loaded"] is False


# ------------------------------------------------ admissions in chunks


@pytest.mark.app_settings(num_blocks=256, block_size=4, max_tokens_per_request=3000)
async def test_long_prompts_are_prefilled_in_chunks_with_the_whole_prefix_hit(api: Api) -> None:
    """No engine command of the replay brings in more than a chunk of new
    tokens, and a prompt still hits its whole cached prefix (as one admission
    of the whole prompt would)."""
    driver: TraceDriver = api.app.state.trace_driver
    driver.prefill_chunk, driver.step_tokens = 16, 32
    applied: list[tuple[str, int, int]] = []  # (op, tokens, of them computed already)
    apply = api.engine.apply

    def spy(op: Any) -> dict[str, Any]:
        res = apply(op)
        if isinstance(op, AdmitOp | AppendOp) and (op.request_id or "").startswith("trace-"):
            hit = int(res["num_computed_tokens"]) if isinstance(op, AdmitOp) else 0
            applied.append((op.op, len(op.token_ids), hit))
        return res

    api.engine.apply = spy  # type: ignore[method-assign]
    # one 200-token request (50 ids of 4), replayed to the end: its blocks stay cached
    first = {"timestamp": 0, "input_length": 200, "output_length": 3, "hash_ids": list(range(50))}
    r = await api.client.post("/api/trace/upload?tokens_per_id=4", content=json.dumps(first))
    assert r.status_code == 200, r.text
    await api.ok("POST", "/api/trace/start?speed=100")
    s = await _wait(api, lambda s: s["stats"]["finished"] == 1 and not s["running"])
    assert s["stats"]["hit_tokens"] == 0 and s["stats"]["prompt_tokens"] == 200
    # two more sharing its first 40 ids (160 tokens), each with a tail of its own
    rows = [
        {"timestamp": i, "input_length": 200, "output_length": 3,
         "hash_ids": list(range(40)) + list(range(100 + 10 * i, 110 + 10 * i))}
        for i in range(2)
    ]  # fmt: skip
    body = "\n".join(json.dumps(r) for r in rows)
    assert (await api.client.post("/api/trace/upload?tokens_per_id=4", content=body)).is_success
    await api.ok("POST", "/api/trace/start?speed=100")
    s = await _wait(api, lambda s: s["stats"]["finished"] == 2 and not s["running"])
    assert s["stats"]["hit_tokens"] == 2 * 160 and s["stats"]["prompt_tokens"] == 400
    assert s["stats"]["preemptions"] == 0
    admits = [a for a in applied if a[0] == "admit"]
    assert len(admits) == 3
    assert [hit for _, _, hit in admits] == [0, 160, 160]
    assert all(n - hit <= 16 for _, n, hit in admits), admits
    assert all(n <= 16 for op, n, _ in applied if op == "append"), applied
    prefill = sum(n - hit for _, n, hit in admits) + sum(
        n for op, n, _ in applied if op == "append"
    )
    # every token once: prompts less hits, and the outputs but each request's
    # last (sampled, never written: vLLM's scheduler takes no slot for it)
    assert prefill == 3 * 200 + 3 * (3 - 1) - 160 * 2
    assert api.engine.manager.requests == {}


@pytest.mark.app_settings(num_blocks=256, block_size=4, max_tokens_per_request=3000)
async def test_a_stop_gives_the_blocks_back_and_a_start_resumes_them(api: Api) -> None:
    """A stop frees the running requests and queues them first; the start
    after it recomputes them and counts no request twice."""
    rows = [{"timestamp": 0, "input_length": 40, "output_length": 100,
             "hash_ids": [1000 + 10 * i + k for k in range(10)]} for i in range(4)]  # fmt: skip
    body = "\n".join(json.dumps(r) for r in rows)
    assert (await api.client.post("/api/trace/upload?tokens_per_id=4", content=body)).is_success
    await api.ok("POST", "/api/trace/start?speed=1")
    await _wait(api, lambda s: s["requests_running"] == 4)
    stopped = await api.ok("POST", "/api/trace/stop")
    assert stopped["requests_running"] == 0 and stopped["requests_waiting"] == 4
    assert not [rid for rid in api.engine.manager.requests if rid.startswith("trace-")]
    await api.ok("POST", "/api/trace/start?speed=1000")
    s = await _wait(api, lambda s: s["stats"]["finished"] == 4 and not s["running"])
    assert (s["stats"]["arrived"], s["stats"]["admitted"], s["stats"]["refused"]) == (4, 4, 0)
    assert s["stats"]["prompt_tokens"] == 4 * 40 and s["stats"]["preemptions"] == 0
    assert api.engine.manager.requests == {}
    api.check()


# ------------------------------------------------ one workload, races


LOOPING = _rows(12, 14)


async def test_one_workload_at_a_time_and_idempotent(api: Api) -> None:
    assert (await api.client.post("/api/trace/upload?tokens_per_id=4", content=LOOPING)).is_success
    started = await asyncio.gather(
        api.post("/api/demo/start"), api.post("/api/trace/start?loop=true&speed=20")
    )
    codes = sorted(r.status_code for r in started)
    assert codes == [200, 409], [r.text for r in started]
    refused = next(r for r in started if r.status_code == 409)
    demo_won = started[0].status_code == 200
    assert_error(refused, 409, "conflict", contains="demo" if demo_won else "trace replay")
    first, second = ("demo", "trace") if demo_won else ("trace", "demo")
    # a start while running changes nothing; the other stays refused
    assert (await api.ok("POST", f"/api/{first}/start"))["running"] is True
    assert_error(await api.post(f"/api/{second}/start"), 409, "conflict")
    for _ in range(2):  # a stop twice: the second finds it stopped
        stopped = await api.ok("POST", f"/api/{first}/stop")
        assert stopped["running"] is False and stopped["requests_running"] == 0
    assert (await api.ok("POST", f"/api/{second}/start"))["running"] is True
    assert_error(await api.post(f"/api/{first}/start"), 409, "conflict", contains=second)
    await api.ok("POST", f"/api/{second}/stop")
    assert api.engine.manager.requests == {}


def _live_workload_tasks() -> list[asyncio.Task[Any]]:
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name() in ("trace-replay", "demo-workload") and not t.done()
    ]


async def test_racing_starts_and_stops_never_orphan_the_replay(api: Api) -> None:
    assert (await api.client.post("/api/trace/upload?tokens_per_id=4", content=LOOPING)).is_success
    calls = ["/api/trace/start?loop=true&speed=50", "/api/trace/stop", "/api/demo/start",
             "/api/demo/stop"]  # fmt: skip
    for i in range(25):
        order = calls[i % 4 :] + calls[: i % 4]
        rs = await asyncio.gather(*(api.post(u) for u in order * 2))
        assert all(r.status_code in (200, 409) for r in rs), [r.text for r in rs]
        # never both, never a task /api/trace and /api/demo do not report
        live = _live_workload_tasks()
        trace = (await api.ok("GET", "/api/trace"))["running"]
        demo = (await api.ok("GET", "/api/demo"))["running"]
        assert not (trace and demo)
        assert sorted(t.get_name() for t in live) == sorted(
            ["trace-replay"] * trace + ["demo-workload"] * demo
        )
    await asyncio.gather(api.post("/api/trace/stop"), api.post("/api/demo/stop"))
    assert _live_workload_tasks() == []
    assert (await api.ok("GET", "/api/trace"))["running"] is False
    assert not [rid for rid in api.engine.manager.requests if rid.startswith("trace-")]
    admitted = api.engine.counters.requests_admitted
    await asyncio.sleep(0)  # nothing left to run: no admissions after the stop
    assert _live_workload_tasks() == [] and api.engine.counters.requests_admitted == admitted


async def test_a_start_landing_inside_a_stop_keeps_its_task(api: Api) -> None:
    """The race that orphaned the replay: the stopped task ends, a start
    spawns a new one, then the stop resumes; the new task stays known (and
    reachable by the next stop)."""
    assert (await api.client.post("/api/trace/upload?tokens_per_id=4", content=LOOPING)).is_success
    driver: TraceDriver = api.app.state.trace_driver
    driver.configure(speed=50, loop=True)
    driver.start()
    first = driver._task
    assert first is not None
    # runs when the first task is done, before the stop awaiting it resumes
    first.add_done_callback(lambda _: driver.start())
    await driver.stop()
    second = driver._task
    assert second is not None and second is not first and not second.done()
    assert (await api.ok("GET", "/api/trace"))["running"] is True
    assert _live_workload_tasks() == [second]
    await api.ok("POST", "/api/trace/stop")
    assert _live_workload_tasks() == [] and driver._task is None
    assert not [rid for rid in api.engine.manager.requests if rid.startswith("trace-")]


# ------------------------------------------------ bad files, no tracebacks


UPLOAD_CASES = [
    ("[" * 50_000 + "]" * 50_000, 1, None, "nested too deeply"),
    ('{"timestamp": 0, "input_length": ' + "7" * 4400 + "}", 1, None, "4300 digits"),
    (
        "\n".join(
            [
                HEADER,
                json.dumps(
                    {
                        "type": "op",
                        "ts": 1.0,
                        "ok": True,
                        "op": {"op": "admit", "request_id": "a", "token_ids": [1, 2]},
                    }
                ),
                json.dumps(
                    {
                        "type": "op",
                        "ts": 2.0,
                        "ok": True,
                        "op": {"op": "append", "request_id": ["a"], "token_ids": [3]},
                    }
                ),
            ]
        ),
        3,
        "op.request_id",
        "must be a string",
    ),
    (
        '{"timestamp": NaN, "input_length": 4, "output_length": 1, "hash_ids": [1]}',
        1,
        "timestamp",
        "finite",
    ),
    (
        '{"timestamp": 1e308, "input_length": 4, "output_length": 1, "hash_ids": [1]}',
        1,
        "timestamp",
        "max_timestamp_ms",
    ),
    (
        '{"timestamp": 0, "input_length": 4, "output_length": 1000000000000, "hash_ids": [1]}',
        1,
        "output_length",
        "max_tokens_per_request",
    ),
]


@pytest.mark.parametrize(("body", "line", "field", "words"), UPLOAD_CASES)
async def test_a_bad_file_is_a_422_naming_line_and_field(
    api: Api, body: str, line: int, field: str | None, words: str
) -> None:
    before = api.fingerprint()
    r = await api.client.post("/api/trace/upload?tokens_per_id=4", content=body)
    err = assert_error(r, 422, "invalid_input", contains=words)
    assert err["details"]["line"] == line and err["details"]["field"] == field, err
    assert f"line {line}: " in err["message"]
    assert (await api.ok("GET", "/api/trace"))["loaded"] is False
    assert api.fingerprint() == before


def test_serve_trace_refuses_a_request_over_the_limit(tmp_path: Path) -> None:
    # valid as a trace, too long for this server: invalid settings, not a traceback
    p = tmp_path / "long.jsonl"
    row = {"timestamp": 0, "input_length": 300_000, "output_length": 1,
           "hash_ids": list(range(586))}  # fmt: skip
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"long\.jsonl.*line 1: .*max_tokens_per_request"):
        make_app(trace=str(p), num_blocks=100_000, block_size=16)


def test_an_abandoned_upload_is_one_log_line(
    live_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as s:
        s.sendall(
            b"POST /api/trace/upload HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 1000000\r\n\r\n" + b'{"timestamp": 0, ' * 100
        )
        time.sleep(0)  # the socket closes with the body cut short
    deadline = time.monotonic() + 30
    while not any("abandoned" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.02)
    assert httpx.get(live_server.url + "/api/health", timeout=30).status_code == 200
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
