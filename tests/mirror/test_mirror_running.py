"""A mirror's running and waiting requests are the engine's (its request
records, app/mirror/queues.py) or null with the reason; its /metrics says
them under blockpool_engine_* and carries no vLLM-named series."""

from __future__ import annotations

import pytest

from app.mirror.queues import EngineQueues
from blockpool.mirror.protocol import Arrive, Finished, Preempted, Scheduled
from tests.app.conftest import running
from tests.mirror.rig import Rig, metric, until

pytestmark = pytest.mark.anyio


def test_the_queues_follow_vllms_scheduler_moves() -> None:
    q = EngineQueues()
    assert q.counts() == {
        "running": None, "waiting": None, "admitted": None, "finished": None,
        "refused": None, "reason": q.unknown_reason,
    }  # fmt: skip
    q.heard(0, 100.0)  # the engine's handshake: no batch made yet
    assert q.counts() == {
        "running": 0, "waiting": 0, "admitted": 0, "finished": 0, "refused": None,
        "reason": None,
    }  # fmt: skip
    q.batch(1, 101.0, [Arrive("a", 101.0, 64, []), Arrive("b", 101.0, 64, [])])
    assert (q.running, q.waiting) == (0, 2)
    q.batch(2, 102.0, [Scheduled("a", 102.0, 0), Scheduled("b", 102.0, 32)])
    assert (q.running, q.waiting, q.started) == (2, 0, 2)
    q.batch(3, 103.0, [Arrive("c", 103.0, 64, []), Preempted("b", 103.0)])
    assert (q.running, q.waiting) == (1, 2)
    # b resumed (vLLM's scheduled_resumed_reqs): running again, nothing started
    q.batch(4, 104.0, [Scheduled("b", 104.0, 0), Finished("a", 104.0, 70)])
    assert (q.running, q.waiting, q.started, q.ended) == (1, 1, 2, 1)
    q.batch(5, 105.0, [Finished("c", 105.0, 64)])  # aborted while waiting
    assert (q.running, q.waiting, q.ended) == (1, 0, 2)
    assert set(q.state) == {"b"}
    assert (q.counts()["admitted"], q.counts()["finished"]) == (2, 2)
    # the past, from the changes kept
    assert q.at(100.5) == {"running": 0, "waiting": 0, "reason": None}
    assert q.at(103.0) == {"running": 1, "waiting": 2, "reason": None}
    assert q.at(104.5) == {"running": 1, "waiting": 1, "reason": None}
    moved = q.between(101.5, 105.0, 100)
    assert moved == {"started": ["a", "b"], "ended": ["a", "c"], "reason": None}
    assert q.between(103.5, 105.0, 100)["started"] == []  # a resumption starts nothing
    assert "before the mirror heard" in str(q.at(99.0)["reason"])


def test_a_mirror_that_joined_late_or_missed_a_batch_does_not_know() -> None:
    late = EngineQueues()
    late.batch(7, 10.0, [Scheduled("x", 10.0, 0)])
    got = late.counts()
    assert got["running"] is None and got["waiting"] is None
    assert "joined the engine at its batch 7" in got["reason"]
    assert late.between(0.0, 20.0, 10)["started"] is None
    late.heard(0, 11.0)  # a later handshake changes nothing: requests were missed
    assert late.counts()["running"] is None
    late.restart()  # a new run of the engine: it holds nothing of the old one's
    late.batch(1, 12.0, [Arrive("y", 12.0, 32, [])])
    got = late.counts()
    assert (got["running"], got["waiting"], got["reason"]) == (0, 1, None)

    gap = EngineQueues()
    gap.heard(0, 1.0)
    gap.batch(1, 2.0, [Arrive("a", 2.0, 32, [])])
    gap.batch(3, 3.0, [Scheduled("a", 3.0, 0)])  # batch 2 never came
    assert gap.counts()["running"] is None
    assert "batches 2..2" in gap.counts()["reason"]


async def test_the_mirror_says_the_engines_running_requests(rig: Rig) -> None:
    engine = rig.engine
    engine.tell_requests = True  # records of each request, as the plugin sends them
    hello = await rig.hello()
    assert hello.seq == 0  # the mirror listens from the engine's start
    app, client = rig.service(hello)
    async with running(app) as api:
        await until(lambda: client.applier.synced and client.queues.first_seq is not None)
        await rig.drive(client, 10, 5)
        first = (await api.ok("GET", "/api/history"))["last_seq"]
        admitted0 = engine.rt.counters.requests_admitted
        finished0 = engine.rt.counters.requests_finished
        await rig.drive(client, 20, 5)
        await until(lambda: client.queues.running == len(engine.rt.manager.requests))
        last = (await api.ok("GET", "/api/history"))["last_seq"]
        held = len(engine.rt.manager.requests)
        assert held > 0  # (the workload's seed leaves requests running)
        assert engine.rt.counters.requests_finished > finished0  # some ended in between

        summary = await api.ok("GET", "/api/summary")
        assert summary["running_requests"] == held
        assert summary["waiting_requests"] == 0 and summary["requests_reason"] is None
        counters, theirs = summary["counters"], engine.rt.counters
        assert counters["requests_admitted"] == theirs.requests_admitted > 0
        assert counters["requests_finished"] == theirs.requests_finished > 0
        assert counters["requests_refused"] is None  # vLLM refuses none: not a 0
        rates = await api.ok("GET", "/api/pool/rates")
        assert (rates["requests_running"], rates["requests_waiting"]) == (held, 0)
        # the running panel: the engine's running requests, their prefix hits
        page = await api.ok("GET", "/api/requests", params={"limit": 1000})
        assert page["total"] == held and page["reason"]
        assert {i["request_id"] for i in page["items"]} == set(engine.rt.manager.requests)
        for item in page["items"]:
            managed = engine.rt.manager.requests[item["request_id"]]
            assert item["num_hit_blocks"] == managed.num_hit_blocks
            assert item["num_prompt_tokens"] == managed.request.num_prompt_tokens
            assert item["num_tokens"] is None and item["num_blocks"] is None  # not told
        text = (await api.get("/metrics")).text
        assert metric(text, "blockpool_engine_num_requests_running") == held
        assert metric(text, "blockpool_engine_num_requests_waiting") == 0
        assert metric(text, "blockpool_engine_requests_known") == 1
        assert metric(text, "blockpool_requests_admitted_total") == theirs.requests_admitted
        assert "blockpool_requests_refused_total" not in text
        # no series under a name vLLM's engine exposes beside it
        assert not [x for x in text.splitlines() if x.startswith("vllm:")]

        # the diff between two moments: the engine's requests started and ended
        diff = await api.ok("GET", "/api/history/diff", params={"from": first, "to": last})
        reqs = diff["requests"]
        assert reqs["source"] == "engine" and reqs["reason"] is None
        assert reqs["started"] and reqs["ended"]
        assert len(reqs["started"]) == engine.rt.counters.requests_admitted - admitted0
        assert len(reqs["ended"]) == engine.rt.counters.requests_finished - finished0
        assert reqs["running_to"] == held
        state = await api.ok("GET", "/api/history/state", params={"at": last})
        assert state["summary"]["running_requests"] == held
        assert state["tiles"]["running"] == held and state["tiles"]["running_reason"] is None

        # what a mirror cannot know is null with the reason, never a default
        tokens = summary["tokens"]
        assert tokens["held"] is None and tokens["fill_ratio"] is None
        assert tokens["tail_waste"] is None and "not its tokens" in tokens["reason"]
        assert "blockpool_tokens_held" not in text
        regret = await api.ok("GET", "/api/regret")
        assert "without the request" in regret["requests_reason"]
    app.state.engine.check()


async def test_a_mirror_started_mid_run_says_it_does_not_know(rig: Rig) -> None:
    engine = rig.engine
    engine.tell_requests = True
    engine.drive(20)  # requests admitted before the mirror listens
    hello = await rig.hello()
    app, client = rig.service(hello)
    async with running(app) as api:
        await rig.drive(client, 5, 5)
        await until(lambda: client.queues.first_seq is not None)
        summary = await api.ok("GET", "/api/summary")
        assert summary["running_requests"] is None and summary["waiting_requests"] is None
        assert "joined the engine" in summary["requests_reason"]
        assert summary["counters"]["requests_admitted"] is None
        assert summary["counters"]["requests_finished"] is None
        rates = await api.ok("GET", "/api/pool/rates")
        assert rates["requests_running"] is None and rates["requests_reason"]
        page = await api.ok("GET", "/api/requests")
        assert page["total"] is None and page["items"] == [] and page["reason"]
        text = (await api.get("/metrics")).text
        assert "blockpool_engine_num_requests_running" not in text  # absent, not 0
        assert metric(text, "blockpool_engine_requests_known") == 0
        points = (await api.ok("GET", "/api/series", params={"limit": 5}))["points"]
        assert points and all(p["requests"] is None and p["waiting"] is None for p in points)
    app.state.engine.check()
