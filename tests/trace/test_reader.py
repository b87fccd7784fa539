"""Reading Mooncake traces and recordings: tokens, validation, line numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockpool.trace import TraceError, parse_mooncake, parse_recording, parse_trace, read_trace
from tests.trace.helpers import HEAD50, row, rows_to_lines


def test_tokens_follow_hash_ids_and_the_last_id_holds_the_remainder() -> None:
    tr = parse_mooncake(rows_to_lines([row(0, [7, 3], 6), row(5, [7], 2, 3)]), tokens_per_id=4)
    a, b = tr.requests
    assert tr.prompt_token_ids(a) == [28, 29, 30, 31, 12, 13]
    assert tr.prompt_token_ids(b) == [28, 29]  # same id, same offsets: same tokens
    outs_a, outs_b = tr.output_token_ids(a), tr.output_token_ids(b)
    assert len(outs_a) == 1 and len(outs_b) == 3
    prompt = set(tr.prompt_token_ids(a)) | set(tr.prompt_token_ids(b))
    assert not (set(outs_a) | set(outs_b)) & prompt
    assert len(set(outs_a) | set(outs_b)) == 4


def test_the_shared_trace_head_reads_with_its_lengths() -> None:
    tr = read_trace(HEAD50)
    assert len(tr) == 50
    first = tr.requests[0]
    assert first.input_length == 40160 and len(first.hash_ids) == 79
    assert len(tr.prompt_token_ids(first)) == 40160


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("not json", "not JSON"),
        (json.dumps([1, 2]), "JSON object"),
        (json.dumps(row(0, [1], 0)), "input_length must be >= 1"),
        (json.dumps(row(0, [], 3)), "hash_ids must be a non-empty list"),
        (json.dumps(row(0, [1, -2], 600)), "integers >= 0"),
        (json.dumps(row(0, [1, 2], 512)), "the last id would hold 0 tokens"),
        (json.dumps(row(0, [1], 513)), "the last id would hold 513 tokens"),
        (json.dumps({**row(0, [1], 5), "output_length": "x"}), "output_length must be an integer"),
        (json.dumps({**row(0, [1], 5), "timestamp": -1}), "timestamp must be"),
        (json.dumps(row(0, [1], 5, 1) | {"input_length": True}), "integer"),
        (json.dumps(row(float("inf"), [1], 5)), "timestamp must be a finite number"),
        (json.dumps(row(0.5, [1], 5)), "arrival order"),
    ],
)
def test_a_bad_row_names_its_line(bad: str, needle: str) -> None:
    lines = [json.dumps(row(1, [1], 5)), "", bad]
    with pytest.raises(TraceError, match=needle) as err:
        parse_mooncake(lines)
    assert err.value.line == 3
    assert str(err.value).startswith("line 3: ")


def test_empty_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no request"):
        parse_mooncake(["", "  "])
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")
    p = tmp_path / "bin.jsonl"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(TraceError, match="UTF-8"):
        read_trace(p)
    with pytest.raises(TraceError, match="tokens per id"):
        parse_mooncake([json.dumps(row(0, [1], 5))], tokens_per_id=0)


def _recording(ops: list[dict[str, object]]) -> list[str]:
    head = {"type": "header", "format": "blockpool-recording", "version": 1, "settings": {}}
    out = [json.dumps(head), json.dumps({"type": "keyframe", "seq": 0})]
    out += [json.dumps(o) for o in ops]
    return out


def test_a_recording_gives_its_admitted_requests() -> None:
    lines = _recording([
        {"type": "op", "seq": 1, "ts": 100.0, "ok": True,
         "op": {"op": "admit", "request_id": "a", "token_ids": [1, 2, 3]},
         "result": {"request_id": "a"}},
        {"type": "op", "seq": 2, "ts": 100.5, "ok": False,
         "op": {"op": "admit", "request_id": "b", "token_ids": [9]}},
        {"type": "op", "seq": 3, "ts": 101.0, "ok": True,
         "op": {"op": "append", "request_id": "a", "token_ids": [4, 5]}},
        {"type": "op", "seq": 4, "ts": 102.0, "ok": True,
         "op": {"op": "admit", "request_id": "c", "token_ids": [1, 2], "cache_salt": "s"}},
    ])  # fmt: skip
    tr = parse_trace("\n".join(lines))
    assert tr.source == "recording"
    a, c = tr.requests
    assert tr.prompt_token_ids(a) == [1, 2, 3] and a.output_length == 2
    assert c.timestamp_ms == pytest.approx(2000.0) and c.cache_salt == "s"
    assert set(tr.output_token_ids(a)).isdisjoint({1, 2, 3})
    with pytest.raises(TraceError, match="line 3: admit token_ids"):
        parse_recording(_recording([{"type": "op", "ts": 1.0, "ok": True,
                                      "op": {"op": "admit", "token_ids": []}}]))  # fmt: skip
    with pytest.raises(TraceError, match="no header"):
        parse_recording(lines[1:])
