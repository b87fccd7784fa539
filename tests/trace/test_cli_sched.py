"""``blockpool trace --mode timed``: the scheduler's flags, fields and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from blockpool.core.attention import FULL_ATTENTION, SLIDING_WINDOW, GroupSpec
from blockpool.trace.sched.scheduler import SchedulerConfig
from tests.trace.sched_traces import TOKENS_PER_ID, write_trace


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    p = tmp_path / "t.jsonl"
    write_trace(p, 5, 40)
    return p


def _doc(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["trace", *argv, "--tokens-per-id", str(TOKENS_PER_ID), "--mode", "timed",
                 "--json", "--no-progress"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_defaults_are_vllms_and_both_hit_rates_are_named(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc(capsys, str(trace_file), "--capacity-tokens", "3200,inf", "--max-model-len", "2000")
    small, inf = doc["results"]  # type: ignore[misc]
    sched = small["scheduler"]
    assert sched["enable_chunked_prefill"] and sched["async_scheduling"]
    assert sched["max_num_batched_tokens"] == 8192 and sched["max_model_len"] == 2000
    for r in (small, inf):
        assert r["request_hit_rate"] == r["hit_rate"]
        assert r["prefix_cache_hit_rate"] == r["prefix_cache_hits"] / r["prefix_cache_queries"]
        assert set(r["ttft_ms"]) == {"p50", "p90", "p99", "mean"}
        assert r["rejected_too_long"] > 0  # the trace has prompts of 2000+ tokens
    assert inf["evictions"] == 0 and inf["preemptions"] == 0


def test_each_feature_turns_off_and_simple_is_every_feature_off(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    off = _doc(capsys, str(trace_file), "--capacity-tokens", "3200", "--max-num-batched-tokens",
               "0", "--no-chunked-prefill", "--sync-scheduling")  # fmt: skip
    simple = _doc(capsys, str(trace_file), "--capacity-tokens", "3200", "--scheduler", "simple")
    (a,), (b,) = off["results"], simple["results"]  # type: ignore[misc]
    for k in ("hit_tokens", "evictions", "refused", "preemptions", "miss_reasons"):
        assert a[k] == b[k], k
    assert a == b  # one scheduler: simple is it with every feature off


def test_step_model_file_and_its_errors(
    trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "steps.json"
    model.write_text(json.dumps({"base_ms": 5, "per_prefill_token_ms": 0.01}))
    doc = _doc(capsys, str(trace_file), "--step-model", str(model))
    (r,) = doc["results"]  # type: ignore[misc]
    assert r["scheduler"]["step_model"] == {
        "base_ms": 5.0, "per_prefill_token_ms": 0.01, "per_decode_seq_ms": 0.0}  # fmt: skip
    model.write_text("{\n  nope")
    argv = ["trace", str(trace_file), "--tokens-per-id", "64", "--mode", "timed"]
    assert main([*argv, "--step-model", str(model)]) == 2
    assert "--step-model" in capsys.readouterr().err
    model.write_text(json.dumps({"samples": [[1, 2, 3]]}))
    assert main([*argv, "--step-model", str(model)]) == 2
    assert "at least 3 samples" in capsys.readouterr().err
    assert main([*argv, "--max-num-batched-tokens", "-1"]) == 2
    assert "--max-num-batched-tokens" in capsys.readouterr().err
    assert main([*argv, "--no-chunked-prefill", "--max-num-batched-tokens", "100",
                 "--max-model-len", "1000"]) == 2  # fmt: skip
    assert "smaller than max_model_len" in capsys.readouterr().err


def test_the_table_names_both_hit_rates(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", str(trace_file), "--tokens-per-id", "64", "--mode", "timed",
                 "--capacity-tokens", "3200", "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "request_hit_rate" in out and "prefix_cache_hit_rate" in out
    assert "ttft_ms p50/p90/p99" in out


def test_a_layout_with_kv_cache_groups_runs_them_and_says_so(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from blockpool.trace import read_trace
    from blockpool.trace.plan.report import replay_trace
    from blockpool.trace.sched.timed import TimedConfig

    budget = ["--max-num-batched-tokens", "512"]
    # two groups: 3200 tokens as vLLM logs them = 3200 // 16 * 2 = 400 blocks
    groups = ["--kv-cache-groups", "full,sliding:256", "--capacity-tokens", "3200"]
    argv = [str(trace_file), *budget, *groups]
    doc = _doc(capsys, *argv)
    (r,) = doc["results"]  # type: ignore[misc]
    assert r["kv_cache_groups"] == [
        {"kind": "full_attention", "block_size": 16, "sliding_window": None},
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 256},
    ]
    assert r["blocks"] == 400
    # the replay of those groups, as the library runs it, on the same 400 blocks
    sched = SchedulerConfig(max_num_batched_tokens=512)
    specs = (GroupSpec(FULL_ATTENTION, 16), GroupSpec(SLIDING_WINDOW, 16, 256))
    timed = TimedConfig(scheduler=sched, groups=specs)
    direct = replay_trace(read_trace(trace_file, TOKENS_PER_ID), mode="timed",
                          capacities_tokens=[400 * 16], timed=timed).results[0]  # fmt: skip
    assert (r["hit_tokens"], r["preemptions"], r["refused"]) == (
        direct.hit_tokens, direct.preemptions, direct.refused)  # fmt: skip
    (plain,) = _doc(capsys, str(trace_file), *budget, "--capacity-tokens", "6400")["results"]  # type: ignore[misc]
    assert "kv_cache_groups" not in plain and plain["blocks"] == 400
    assert plain["preemptions"] < r["preemptions"]  # two groups share the one pool
    assert main(["trace", *argv, "--tokens-per-id", str(TOKENS_PER_ID), "--mode", "timed",
                 "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "KV-cache groups (2, one pool): full_attention, sliding_window 256" in out
    # timed mode classifies misses over groups: no note saying it does not
    assert "not classified" not in out and "miss_reasons_note" not in doc
    assert sum(r["miss_reasons"].values()) > 0


def test_the_scheduler_table_gives_each_capacity_in_vllms_tokens_over_groups(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two groups of 3200 tokens (as vLLM logs them) are 400 blocks: the
    scheduler table's capacity_tokens says 3200, not the blocks' 6400 slots."""
    argv = [str(trace_file), "--max-num-batched-tokens", "512", "--kv-cache-groups",
            "full,sliding:256", "--capacity-tokens", "3200,inf"]  # fmt: skip
    assert main(["trace", *argv, "--tokens-per-id", str(TOKENS_PER_ID), "--mode", "timed",
                 "--no-progress"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["capacity_tokens"])
    assert [line.split()[0] for line in lines[head + 1 : head + 3]] == ["3200", "inf"]


def test_the_scheduler_flags_are_the_fields_of_scheduler_flags() -> None:
    """Each field of SchedulerFlags is a ``blockpool trace`` flag with its
    default and help; a switch whose field defaults to True turns it off."""
    import dataclasses

    from app.cli import parser
    from app.cli.trace_sched import SchedulerFlags
    from blockpool.trace.sched.scheduler import POLICIES

    trace = parser()._subparsers._group_actions[0].choices["trace"]
    actions = {a.dest: a for a in trace._actions}
    for f in dataclasses.fields(SchedulerFlags):
        action = actions[f.name]
        option = f.metadata["flag"] or f"--{f.name.replace('_', '-')}"
        assert action.option_strings == [option]
        assert action.default == f.default and action.help == f.metadata["help"]
    assert actions["chunked_prefill"].option_strings == ["--no-chunked-prefill"]
    assert actions["async_scheduling"].option_strings == ["--sync-scheduling"]
    assert actions["policy"].choices == list(POLICIES) == ["fcfs", "priority"]
    assert actions["scheduler"].choices == ["vllm", "simple"]
    assert actions["max_num_batched_tokens"].type is int
