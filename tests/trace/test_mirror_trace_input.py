"""``blockpool trace`` reads a mirror's traffic: the ``blockpool-mirror-trace``
file of ``GET /api/mirror/trace`` and a mirror's recording (its request
rows), written by ``blockpool.mirror.traffic`` from the engine's records."""

from __future__ import annotations

import json

import pytest

from blockpool.core.hashing import get_hash_fn_by_name
from blockpool.mirror.protocol import Arrive, Finished, Preempted, Scheduled
from blockpool.mirror.traffic import TrafficLog, request_lines, traffic_lines
from blockpool.trace import TraceError, parse_trace
from blockpool.trace.replay.sequence import replay_pools

H = [bytes([i]) * 32 for i in range(8)]


def served_log() -> TrafficLog:
    """Three engine requests: two sharing two blocks, one skipping the cache,
    one still running."""
    log = TrafficLog()
    log.apply([Arrive("a", 100.0, 10, H[:2]), Scheduled("a", 100.0, 0)])
    log.apply([Arrive("b", 100.5, 13, [*H[:2], H[5]]), Scheduled("b", 100.5, 8)])
    log.apply([Arrive("s", 101.0, 9, H[:2], True), Scheduled("s", 101.0, 0)])
    log.apply([Finished("a", 102.0, 15), Preempted("b", 102.0), Finished("s", 102.0, 10)])
    log.apply([Scheduled("b", 103.0, 0), Finished("b", 104.0, 20)])
    log.apply([Arrive("r", 105.0, 4, [H[0]]), Scheduled("r", 105.0, 4)])  # running
    log.apply([Arrive("x", 106.0, 8, H[:2]), Finished("x", 107.0, 8)])  # aborted, never ran
    return log


def test_a_mirrors_traffic_is_a_trace_of_hash_ids() -> None:
    log = served_log()
    text = "".join(traffic_lines(log, 4, {"vllm_version": "0.32.0"}))
    lines = [json.loads(x) for x in text.splitlines()]
    head, rows = lines[0], lines[1:]
    assert head["format"] == "blockpool-mirror-trace" and head["tokens_per_id"] == 4
    assert head["requests"] == 2
    assert head["not_rows"] == {"skips_cache": 1, "never_scheduled": 1, "dropped_before": 0}
    # a: 10 tokens, 2 full blocks + its own partial one; b: the same 2, one more, a partial
    assert rows == [
        {"timestamp": 0.0, "input_length": 10, "output_length": 5, "hash_ids": [0, 1, 2],
         "hit_tokens": 0},
        {"timestamp": 500.0, "input_length": 13, "output_length": 7, "hash_ids": [0, 1, 3, 4],
         "hit_tokens": 8},
    ]  # fmt: skip
    assert "token_ids" not in text
    trace = parse_trace(text)  # tokens per id from the file, not the default 512
    assert trace.tokens_per_id == 4 and trace.source == "mirror traffic"
    assert [r.hash_ids for r in trace.requests] == [(0, 1, 2), (0, 1, 3, 4)]
    # b's first two blocks are a's: a hit of 8 tokens, as the engine had
    res = replay_pools(trace, 4, [None], get_hash_fn_by_name("sha256"))[0]
    assert res.hit_tokens == 8
    assert log.figures()["finished"] == 4 and log.figures()["requests"] == 5


def test_a_mirrors_recording_is_read_for_its_request_rows() -> None:
    log = served_log()
    header = {
        "type": "header",
        "format": "blockpool-recording",
        "version": 1,
        "settings": {"num_blocks": 64, "block_size": 4},
        "engine": {"mirror": True, "tokens_per_id": 4},
    }
    op = {"type": "op", "seq": 1, "ts": 1.0, "op": {"op": "allocate"}, "ok": True}
    lines = [json.dumps(header), json.dumps(op), *request_lines(log, 4, 100.2)]
    trace = parse_trace("\n".join(lines))
    # since 100.2: b alone (a arrived before; s skips the cache; r runs)
    assert [r.hash_ids for r in trace.requests] == [(0, 1, 2, 3)]
    assert trace.requests[0].timestamp_ms == 0.0 and trace.source == "mirror recording"
    none = "\n".join([json.dumps(header), json.dumps(op)])
    with pytest.raises(TraceError, match="holds no request"):
        parse_trace(none)


@pytest.mark.parametrize(
    ("head", "why"),
    [
        ({"format": "blockpool-mirror-trace"}, "tokens_per_id must be an integer"),
        ({"format": "blockpool-mirror-trace", "tokens_per_id": 0}, "tokens_per_id must be"),
        ({"format": "blockpool-mirror-trace", "tokens_per_id": True}, "tokens_per_id must be"),
    ],
)
def test_a_bad_traffic_header_is_refused(head: dict[str, object], why: str) -> None:
    row = {"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [0, 1]}
    with pytest.raises(TraceError, match=why):
        parse_trace(json.dumps(head) + "\n" + json.dumps(row))


def test_bad_rows_of_a_traffic_file_name_their_line() -> None:
    head = json.dumps({"format": "blockpool-mirror-trace", "tokens_per_id": 4})
    ok = {"timestamp": 5, "input_length": 5, "output_length": 0, "hash_ids": [0, 1]}
    early = dict(ok, timestamp=1)
    with pytest.raises(TraceError, match="line 3: timestamp 1 is before"):
        parse_trace("\n".join([head, json.dumps(ok), json.dumps(early)]))
    short = dict(ok, hash_ids=[0])  # 5 tokens cannot fit one id of 4
    with pytest.raises(TraceError, match="line 2: 1 hash ids of 4 tokens"):
        parse_trace("\n".join([head, json.dumps(short)]))
    with pytest.raises(TraceError, match="holds no request"):
        parse_trace(head)


def test_the_log_is_bounded_and_counts_what_it_let_go() -> None:
    log = TrafficLog(max_requests=3)
    for i in range(5):
        log.apply([Arrive(f"r{i}", float(i), 8, H[:2]), Finished(f"r{i}", float(i), 9)])
    assert list(log.requests) == ["r2", "r3", "r4"] and log.dropped == 2
    small = TrafficLog(max_bytes=2000)
    for i in range(10):
        small.apply([Arrive(f"q{i}", float(i), 8, H[:8])])
    assert small.bytes <= 2000 and small.dropped > 0
    assert len(small.requests) + small.dropped == 10
    log.apply([Finished("nobody", 1.0, 3)])
    assert log.unknown == 1
