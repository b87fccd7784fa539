"""``blockpool trace FILE``: the table, the JSON document, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from blockpool.core.free_order import UNCACHED_FIRST
from blockpool.trace import one_pass_curve, read_trace
from blockpool.trace.replay.sequence import pool_accepts_free_order
from tests.trace.helpers import row, rows_to_lines


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    rows = [
        row(0, [1, 2, 3], 1500, 4),
        row(10, [1, 2, 3], 1536, 2),
        row(20, [1, 2, 4, 5], 2000, 3),
        row(30, [9, 8, 7, 6, 5, 4, 3, 2], 3800, 1),
        row(40, [1, 2], 1000, 2),
    ]
    p = tmp_path / "small.jsonl"
    p.write_text("\n".join(rows_to_lines(rows)) + "\n")
    return p


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["trace", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def test_json_document_per_capacity(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, str(trace_file), "--capacity-tokens", "2048,8192,inf", "--no-progress")
    assert doc["mode"] == "sequence" and doc["one_pass"] is True
    results = doc["results"]
    assert isinstance(results, list) and len(results) == 3
    assert doc["free_order"] == "uncached_first" and doc["free_order_vllm"] == "vLLM >= 0.24"
    want = one_pass_curve(read_trace(trace_file), 16, [2048, 8192, None], free_order=UNCACHED_FIRST)
    for got, w in zip(results, want, strict=True):
        assert got["capacity_tokens"] == w.capacity_tokens
        assert got["blocks"] == w.blocks
        assert (got["prompt_tokens"], got["hit_tokens"], got["evictions"], got["refused"]) == (
            9836,
            w.hit_tokens,
            w.evictions,
            w.refused,
        )
        assert got["hit_rate"] == pytest.approx(w.hit_tokens / 9836)
        assert got["mode"] == "sequence" and got["one_pass"] is True
        assert set(got["miss_reasons"]) == {"cold", "evicted", "last_token", "block_size_floor"}
    small, _, inf = results
    assert small["capacity_tokens"] == 2048 and small["blocks"] == 128 and small["refused"] == 1
    assert inf["capacity_tokens"] is None and inf["blocks"] is None and inf["evictions"] == 0
    # 2nd: the 1st's 93 full blocks (its 3rd id held 476 tokens: 29 full blocks);
    # 3rd: ids 1, 2 (64 blocks); 4th: nothing; 5th: 62 of its 62 full blocks but
    # the one holding its last token (1000 = 62 * 16 + 8: the last is partial)
    assert inf["hit_tokens"] == 93 * 16 + 64 * 16 + 62 * 16


def test_separate_pools_give_the_same_numbers(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _json(capsys, str(trace_file), "--capacity-blocks", "100,300")
    sep = _json(capsys, str(trace_file), "--capacity-blocks", "100,300", "--no-one-pass")
    assert sep["one_pass"] is False and "one replay per capacity" in str(sep["note"])
    keys = ("capacity_tokens", "hit_tokens", "evictions", "refused", "miss_reasons")
    assert [[r[k] for k in keys] for r in one["results"]] == [  # type: ignore[attr-defined]
        [r[k] for k in keys]
        for r in sep["results"]  # type: ignore[attr-defined]
    ]
    assert one["results"][0]["capacity_tokens"] == 1600  # type: ignore[index]


def test_timed_mode(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, str(trace_file), "--mode", "timed", "--capacity-tokens", "4096,inf",
                "--speed", "2", "--hash", "xxhash")  # fmt: skip
    assert doc["mode"] == "timed" and doc["one_pass"] is False
    assert "no one pass in timed mode" in str(doc["note"])
    small, inf = doc["results"]  # type: ignore[misc]
    assert inf["hit_tokens"] > 0 and inf["evictions"] == 0 and small["refused"] == 0


def test_the_table(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(trace_file), "--capacity-tokens", "4096,inf", "--progress"]) == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    assert "5 requests" in lines[0]
    assert lines[2].startswith("one pass: exact")
    header = lines[4]
    for h in ("usable (tokens)", "blocks (num_gpu_blocks)", "LRU (%)", "optimal (%)",
              "unbounded (%)", "regret (blocks)", "evictions (blocks)"):  # fmt: skip
        assert h in header
    assert lines[5].split()[:2] == ["4080", "256"]  # 255 usable blocks of 16 tokens
    assert lines[6].split()[:2] == ["inf", "inf"]
    assert "5/5" in cap.err and "ETA" in cap.err  # the progress bar


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(row(0, [1], 100)) + "\n" + json.dumps(row(1, [1], 600)) + "\n")
    assert main(["trace", str(p), "--capacity", "8GiB"]) == 2
    assert "--model-config" in capsys.readouterr().err
    assert main(["trace", str(p)]) == 2
    err = capsys.readouterr().err
    assert "line 2:" in err and "600" in err
    assert main(["trace", str(p), "--capacity-tokens", "10,x"]) == 2
    assert "not a capacity: 'x'" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(row(0, [1], 100)) + "\n")
    assert main(["trace", str(good), "--capacity-tokens", "8"]) == 2
    assert "hold no block" in capsys.readouterr().err
    if not pool_accepts_free_order():
        assert main(["trace", str(good), "--free-order", "uncached_first"]) == 2
        assert "append_all" in capsys.readouterr().err
