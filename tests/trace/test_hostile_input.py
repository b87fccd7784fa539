"""Hostile and unlucky trace files: each is refused naming its line and field
(``blockpool trace``: exit 2, no traceback), before any replay sizes a pool
for it; the limits of ``TraceLimits`` name themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from blockpool.trace import TraceError, TraceLimits, parse_mooncake, parse_trace
from tests.trace.helpers import row

HEADER = json.dumps({"type": "header", "format": "blockpool-recording", "version": 1})
GOOD = json.dumps(row(0, [1], 5))


def _op(ts: str, op: dict[str, object]) -> str:
    return f'{{"type": "op", "ts": {ts}, "ok": true, "op": {json.dumps(op)}}}'


ADMIT_A = _op("1.0", {"op": "admit", "request_id": "a", "token_ids": [1, 2, 3]})

# (file text, the line at fault, the field named, words of the message)
CASES = {
    "nested": (GOOD + "\n" + "[" * 100_000 + "]" * 100_000, 2, None, "nested too deeply"),
    "digits": (
        GOOD + '\n{"timestamp": 1, "input_length": ' + "9" * 5000 + "}",
        2,
        None,
        "4300 digits",
    ),
    "list_request_id": (
        "\n".join(
            [HEADER, ADMIT_A, _op("2.0", {"op": "append", "request_id": ["a"], "token_ids": [4]})]
        ),
        3,
        "op.request_id",
        "must be a string",
    ),
    "finish_dict_request_id": (
        "\n".join([HEADER, ADMIT_A, _op("2.0", {"op": "finish", "request_id": {"a": 1}})]),
        3,
        "op.request_id",
        "must be a string",
    ),
    "recording_nan_ts": (
        "\n".join([HEADER, ADMIT_A, _op("NaN", {"op": "admit", "token_ids": [1]})]),
        3,
        "ts",
        "finite",
    ),
    "recording_minus_inf_ts": (
        "\n".join([HEADER, _op("-Infinity", {"op": "admit", "token_ids": [1]}), ADMIT_A]),
        2,
        "ts",
        "finite",
    ),
    "recording_huge_gap": (
        "\n".join([HEADER, ADMIT_A, _op("1e300", {"op": "admit", "token_ids": [1]})]),
        3,
        "ts",
        "max_timestamp_ms",
    ),
    "output_1e12": (
        json.dumps(row(0, [1], 5, 10**12)),
        1,
        "output_length",
        "max_tokens_per_request",
    ),
    "timestamp_1e308": (
        GOOD + "\n" + json.dumps(row(1e308, [1], 5)),
        2,
        "timestamp",
        "max_timestamp_ms",
    ),
    "timestamp_nan": (
        GOOD + '\n{"timestamp": NaN, "input_length": 5, "output_length": 1, "hash_ids": [1]}',
        2,
        "timestamp",
        "finite",
    ),
    "timestamp_huge_int": (
        GOOD + "\n" + json.dumps(row(10**400, [1], 5)),
        2,
        "timestamp",
        "finite",
    ),
    "hash_id_huge": (json.dumps(row(0, [2**70], 5)), 1, "hash_ids", "<="),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_file_names_line_and_field(name: str) -> None:
    text, line, field, words = CASES[name]
    with pytest.raises(TraceError) as err:
        parse_trace(text)
    assert err.value.line == line, err.value
    assert err.value.field == field, err.value
    assert words in str(err.value)
    assert str(err.value).startswith(f"line {line}: ")
    assert len(str(err.value)) < 300  # a huge value is shown cut short


CLI_CASES = ["nested", "digits", "list_request_id", "recording_nan_ts", "recording_minus_inf_ts",
             "output_1e12", "timestamp_1e308"]  # fmt: skip


@pytest.mark.parametrize("name", CLI_CASES)
@pytest.mark.parametrize("mode", ["sequence", "timed"])
def test_the_cli_exits_2_naming_the_line(
    name: str, mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, line, _, words = CASES[name]
    p = tmp_path / f"{name}.jsonl"
    p.write_text(text + "\n")
    assert main(["trace", str(p), "--mode", mode, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{p}: line {line}: " in err and words in err
    assert "Traceback" not in err


def test_limits_count_requests_and_all_tokens() -> None:
    lines = [json.dumps(row(i, [i], 5, 3)) for i in range(10)]
    with pytest.raises(TraceError, match="max_requests") as err:
        parse_mooncake(lines, limits=TraceLimits(max_requests=4))
    assert (err.value.line, err.value.limit) == (5, "max_requests")
    with pytest.raises(TraceError, match="max_total_tokens") as err:
        parse_mooncake(lines, limits=TraceLimits(max_total_tokens=20))
    assert (err.value.line, err.value.limit) == (3, "max_total_tokens")  # 8 tokens a row
    with pytest.raises(TraceError, match="max_tokens_per_id") as err:
        parse_mooncake(lines, tokens_per_id=1 << 21)
    assert err.value.field == "tokens_per_id"
    assert len(parse_mooncake(lines, limits=TraceLimits(max_requests=10))) == 10


def test_a_recording_whose_appends_grow_past_the_limit() -> None:
    grow = _op("2.0", {"op": "append", "request_id": "a", "token_ids": list(range(10, 20))})
    text = "\n".join([HEADER, ADMIT_A, grow])
    with pytest.raises(TraceError, match="grows past") as err:
        parse_trace(text, limits=TraceLimits(max_tokens_per_request=12))
    assert (err.value.line, err.value.field) == (3, "op.token_ids")
    assert (
        parse_trace(text, limits=TraceLimits(max_tokens_per_request=13)).requests[0].output_length
        == 10
    )


def test_tokens_are_built_only_for_the_slice_asked() -> None:
    # one token of an id a million tokens wide: the prompt is that one token
    tpi = 1 << 20
    tr = parse_mooncake([json.dumps(row(0, [3], 1)), json.dumps(row(1, [3, 5], tpi + 2))], tpi)
    a, b = tr.requests
    assert tr.prompt_token_ids(a) == [3 * tpi]
    assert tr.prompt_token_ids(b, tpi - 2, tpi + 2) == [
        4 * tpi - 2,
        4 * tpi - 1,
        5 * tpi,
        5 * tpi + 1,
    ]
    assert tr.prompt_token_ids(b, tpi + 1) == [5 * tpi + 1]
    assert tr.prompt_token_ids(b, 5, 5) == []
    full = tr.output_token_ids(b)
    assert tr.output_token_ids(b, 0, 1) == full[:1] and len(full) == 1


# ------------------------------------------------ blockpool replay RECORDING

REPLAY_HEADER = {"type": "header", "format": "blockpool-recording", "version": 1,
                 "settings": {"num_blocks": 16, "block_size": 4}}  # fmt: skip
REPLAY_CASES = {
    "nested": (
        [json.dumps(REPLAY_HEADER), "[" * 100_000 + "]" * 100_000],
        "line 2: ",
        "nested too deeply",
    ),
    "digits": (
        [json.dumps(REPLAY_HEADER), '{"type": ' + "1" * 5000 + "}"],
        "line 2: ",
        "4300 digits",
    ),
    "not_an_object": ([json.dumps(REPLAY_HEADER), "[1, 2]"], "line 2: ", "JSON object"),
    "a_huge_pool": (
        [json.dumps({**REPLAY_HEADER, "settings": {"num_blocks": 10**12, "block_size": 4}})],
        "line 1: ",
        "settings.num_blocks",
    ),
    "a_list_op": (
        [json.dumps(REPLAY_HEADER), json.dumps({"type": "op", "seq": 1, "op": ["admit"]})],
        "record 2: ",
        "keyframe",
    ),
}


@pytest.mark.parametrize("name", sorted(REPLAY_CASES))
def test_replay_exits_2_naming_the_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, where, words = REPLAY_CASES[name]
    p = tmp_path / f"{name}.jsonl"
    p.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}: {where}" in err and words in err, err
    assert "Traceback" not in err
