"""Capacity planning: sizes in bytes, vLLM's block count, sweeps, the target
search, other policies, CSV and the plot."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from blockpool.core.free_order import UNCACHED_FIRST
from blockpool.trace import OnePassCurve, parse_mooncake
from blockpool.trace.plan.planner import log_grid, smallest_capacity
from blockpool.trace.replay.optimal import OptimalCurve
from blockpool.trace.sizing.capacity import (
    parse_bytes,
    parse_capacity_list,
)
from blockpool.trace.sizing.model_config import layout_from_config
from tests.trace.helpers import row, rows_to_lines

LLAMA_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}


def _cli(trace_file: Path) -> list[str]:
    """``blockpool trace`` on the test trace (64 tokens per id)."""
    return ["trace", str(trace_file), "--tokens-per-id", "64"]


def test_sizes_and_units() -> None:
    assert parse_bytes("8GiB") == 8 << 30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("500mb") == 500_000_000
    assert parse_bytes("2TiB") == 2 << 40
    assert parse_bytes("4096") is None  # tokens
    with pytest.raises(ValueError, match="unknown unit 'GX'"):
        parse_bytes("8GX")
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes("eight")


def test_vllm_block_count_for_a_gqa_model() -> None:
    layout = layout_from_config(LLAMA_8B)
    # 2 (K, V) x 8 heads x 128 dims x 2 bytes x 32 layers
    assert layout.bytes_per_token == 2 * 8 * 128 * 2 * 32 == 131072
    # get_num_blocks: budget // page_size // num_layers, page = 16 tokens of one layer
    assert layout.num_blocks(8 << 30, 16) == (8 << 30) // (2 * 16 * 8 * 128 * 2) // 32 == 4096
    assert layout.num_blocks((8 << 30) - 1, 16) == 4095
    tp4 = layout_from_config(LLAMA_8B, tensor_parallel_size=4)
    assert tp4.num_kv_heads == 2 and tp4.num_blocks(8 << 30, 16) == 16384
    tp16 = layout_from_config(LLAMA_8B, tensor_parallel_size=16)
    assert tp16.num_kv_heads == 1  # replicated, at least one head a GPU
    fp8 = layout_from_config(LLAMA_8B, kv_cache_dtype="fp8")
    assert fp8.bytes_per_token == 65536


def test_mla_is_one_latent_vector_a_token_on_every_rank() -> None:
    layout = layout_from_config(DEEPSEEK_V3, tensor_parallel_size=8)
    assert layout.mla and layout.num_kv_heads == 1 and layout.head_size == 576
    assert layout.bytes_per_token == 576 * 2 * 61


def test_sliding_windows_give_groups_and_bad_configs_are_refused() -> None:
    mistral = {**LLAMA_8B, "model_type": "mistral", "sliding_window": 4096}
    one = layout_from_config(mistral)
    assert one.attention == (("sliding_window", 4096),) and one.layers_per_group == (32,)
    assert one.num_blocks(8 << 30, 16) == 4096  # one group of 32 layers, as full attention
    # 5 sliding layers to 1 full: group_size 1 (the fewest), 5 sliding groups
    gemma = {
        **LLAMA_8B,
        "num_hidden_layers": 6,
        "sliding_window": 512,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    }
    six = layout_from_config(gemma)
    assert six.attention == (("sliding_window", 512),) * 5 + (("full_attention", None),)
    assert six.group_size == 1 and six.num_blocks(8 << 30, 16) == (8 << 30) // 65536
    # Qwen2 style: a window named but switched off changes nothing
    qwen = {**LLAMA_8B, "sliding_window": 32768, "use_sliding_window": False}
    assert layout_from_config(qwen).bytes_per_token == 131072
    qwen["model_type"] = "qwen2"
    assert layout_from_config(qwen).attention == ()
    with pytest.raises(ValueError, match="num_hidden_layers"):
        layout_from_config({"num_attention_heads": 4})
    with pytest.raises(ValueError, match="positive integer"):
        layout_from_config({**LLAMA_8B, "num_key_value_heads": "8"})
    with pytest.raises(ValueError, match="unknown --kv-cache-dtype"):
        layout_from_config(LLAMA_8B, kv_cache_dtype="fp4")


def test_capacity_list_reports_what_the_pool_holds() -> None:
    layout = layout_from_config(LLAMA_8B)
    a, b, c = parse_capacity_list("8GiB,100001,inf", 16, layout)
    assert (a.blocks, a.usable_tokens, a.bytes) == (4096, 4095 * 16, 8 << 30)
    assert (b.label, b.blocks, b.usable_tokens) == ("100001", 6250, 99984)
    assert c.blocks is None and c.usable_tokens is None
    with pytest.raises(ValueError, match="--bytes-per-token"):
        parse_capacity_list("1GB", 16, None)


def _trace_rows() -> list[dict[str, object]]:
    rows = []
    for i in range(40):
        base = [1, 2, 3] if i % 3 else [7, 8]
        rows.append(row(i, [*base, 100 + i % 5], 16 * 4 * len(base) + 30, 2))
    return rows


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(rows_to_lines(_trace_rows())) + "\n")
    return p


def test_log_grid_and_target_search() -> None:
    assert log_grid(2, 2048, 11) == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    trace = parse_mooncake(rows_to_lines(_trace_rows()), 64)
    opt = OptimalCurve(trace, 16)
    ans = smallest_capacity(trace, 16, 0.3, opt)
    assert ans.lru_blocks is not None and ans.optimal_blocks is not None
    assert ans.optimal_blocks <= ans.lru_blocks

    def lru_rate(b: int) -> float:
        (r,) = OnePassCurve(trace, 16, [b * 16], UNCACHED_FIRST).run()  # the default
        return r.hit_rate

    assert lru_rate(ans.lru_blocks) >= 0.3 > lru_rate(ans.lru_blocks - 1)
    prompt = trace.prompt_tokens
    assert opt.hit_blocks(ans.optimal_blocks - 1) * 16 >= 0.3 * prompt
    assert opt.hit_blocks(ans.optimal_blocks - 2) * 16 < 0.3 * prompt
    none = smallest_capacity(trace, 16, 0.99, opt)
    assert none.lru_blocks is None and none.unbounded_hit_rate < 0.99


def test_cli_bytes_policies_json(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        *_cli(trace_file),
        "--capacity",
        "64KiB,256KiB,inf",
        "--bytes-per-token",
        "64",
        "--policies",
        "optimal,s3fifo",
        "--json",
        "--quiet",
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    small, big, inf = doc["results"]
    # 64 KiB / (64 B x 16 tokens) = 64 blocks: 63 usable
    assert (small["blocks"], small["usable_tokens"], small["bytes"]) == (64, 63 * 16, 65536)
    assert small["capacity"] == "64KiB" and inf["usable_tokens"] is None
    for r in (small, big):
        assert r["hit_tokens"] <= r["optimal_hit_tokens"] <= doc["unbounded_hit_tokens"]
        assert r["s3fifo_hit_tokens"] <= r["optimal_hit_tokens"]
    assert inf["optimal_hit_tokens"] == inf["hit_tokens"] == doc["unbounded_hit_tokens"]
    assert doc["policies"] == ["lru", "optimal", "s3fifo"]
    assert doc["kv_layout"]["bytes_per_token"] == 64 and doc["kv_layout"]["block_bytes"] == 1024


def test_cli_sweep_csv_and_target(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        *_cli(trace_file),
        "--capacity-blocks",
        "4,64",
        "--sweep",
        "--sweep-points",
        "5",
        "--csv",
        "--target-hit-rate",
        "0.2",
    ]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert out.err == ""  # no progress bar when not a terminal
    rows = list(csv.DictReader(io.StringIO(out.out)))
    assert {r["free_order"] for r in rows} == {"uncached_first"}
    blocks = [int(r["blocks"]) for r in rows]
    assert blocks == sorted(blocks) and blocks[0] == 4 and blocks[-1] == 64 and len(rows) >= 5
    for r in rows:
        assert int(r["usable_tokens"]) == (int(r["blocks"]) - 1) * 16
        assert float(r["lru_hit_rate"]) <= float(r["optimal_hit_rate"])
        assert float(r["optimal_gap_rate"]) == pytest.approx(
            float(r["optimal_hit_rate"]) - float(r["lru_hit_rate"])
        )
    assert "regret_blocks" in rows[0] and "evictions_blocks" in rows[0]


def test_cli_errors(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(trace_file), "--tokens-per-id", "64", "--capacity", "1GB"]) == 2
    assert "--model-config" in capsys.readouterr().err
    bad = trace_file.parent / "config.json"
    bad.write_text("{nope")
    assert (
        main(
            [
                "trace",
                str(trace_file),
                "--tokens-per-id",
                "64",
                "--capacity",
                "1GB",
                "--model-config",
                str(bad),
            ]
        )
        == 2
    )
    assert "not JSON" in capsys.readouterr().err
    assert main(["trace", str(trace_file), "--tokens-per-id", "64", "--policies", "fifo"]) == 2
    assert "unknown policy 'fifo'" in capsys.readouterr().err
    assert (
        main(["trace", str(trace_file), "--tokens-per-id", "64", "--target-hit-rate", "1.5"]) == 2
    )
    assert "(0, 1]" in capsys.readouterr().err
    timed = ["--mode", "timed", "--target-hit-rate", "0.5"]
    assert main(["trace", str(trace_file), "--tokens-per-id", "64", *timed]) == 2
    assert "sequence-mode replays" in capsys.readouterr().err
    assert main(["trace", str(trace_file), "--tokens-per-id", "64", "--mode", "timed",
                 "--policies", "s3fifo"]) == 2  # fmt: skip
    assert "sequence mode only" in capsys.readouterr().err


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["trace", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default sha256)" in out and "(default uncached_first" in out


def test_plot_draws_a_png(trace_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    argv = [
        *_cli(trace_file),
        "--capacity",
        "16KiB,64KiB,256KiB",
        "--bytes-per-token",
        "64",
        "--plot",
        str(png),
        "--quiet",
    ]
    assert main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


SWEEP = ["--capacity-blocks", "4,64", "--sweep", "--sweep-points", "5", "--bytes-per-token",
         "64", "--policies", "optimal,s3fifo", "--target-hit-rate", "0.2"]  # fmt: skip
GROUPS = ["--capacity-blocks", "8,32,inf", "--kv-cache-groups", "full,sliding:64",
          "--target-hit-rate", "0.2"]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "asked"),
    [
        (SWEEP, {"capacity_blocks": "4,64", "sweep": True, "sweep_points": 5,
                 "layout": {"bytes_per_token": 64}, "policies": "optimal,s3fifo",
                 "target_hit_rate": 0.2}),
        (GROUPS, {"capacity_blocks": "8,32,inf", "layout": {"kv_cache_groups": "full,sliding:64"},
                  "target_hit_rate": 0.2}),
    ],
)  # fmt: skip
def test_the_library_plan_is_the_commands(
    trace_file: Path, capsys: pytest.CaptureFixture[str], flags: list[str], asked: dict[str, Any]
) -> None:
    """``plan_trace`` on a typed request answers what ``blockpool trace --json``
    prints with the same flags, timings apart."""
    from blockpool.trace import read_trace
    from blockpool.trace.plan.capacity_plan import plan_trace
    from blockpool.trace.plan.plan_request import LayoutRequest, PlanRequest

    assert main([*_cli(trace_file), *flags, "--json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    request = PlanRequest(**{**asked, "layout": LayoutRequest(**asked["layout"])})
    got = plan_trace(request, read_trace(str(trace_file), 64)).to_json()
    timings = {"file", "seconds", "planner_seconds", "wall_seconds"}
    assert {k: v for k, v in got.items() if k not in timings} == {
        k: v for k, v in doc.items() if k not in timings
    }
    assert "target" in got and len(got["results"]) >= 3


def test_the_planner_flags_are_the_requests_fields() -> None:
    """Each flag field of the request is a ``blockpool trace`` flag with the
    field's default; a ``Literal`` gives the choices."""
    import dataclasses
    import typing

    from app.cli import parser
    from app.cli.field_flags import flag_fields
    from app.cli.trace import OutputFlags, TraceFlags
    from app.cli.trace_fleet import FleetFlags
    from blockpool.core.free_order import FREE_ORDERS
    from blockpool.core.hashing import HASH_FUNCTIONS
    from blockpool.trace.fleet import EXECUTORS
    from blockpool.trace.plan.plan_request import LayoutRequest, PlanRequest
    from blockpool.trace.plan.report import MODES
    from blockpool.trace.sizing.capacity import KV_CACHE_DTYPES, KVCacheDtype

    assert typing.get_args(KVCacheDtype) == ("auto", *KV_CACHE_DTYPES)
    trace = parser()._subparsers._group_actions[0].choices["trace"]
    actions = {a.dest: a for a in trace._actions}
    for cls in (LayoutRequest, PlanRequest, FleetFlags, OutputFlags):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in flag_fields(cls):
            action = actions[name]
            assert action.option_strings == [f"--{name.replace('_', '-')}"]
            assert action.default == fields[name].default
            assert action.help == fields[name].metadata["help"]
    assert actions["kv_cache_dtype"].choices == ["auto", *KV_CACHE_DTYPES]
    assert actions["sweep_points"].type is int and actions["target_hit_rate"].type is float
    assert len(flag_fields(LayoutRequest)) == 7 and len(flag_fields(PlanRequest)) == 5
    assert actions["executor"].choices == list(EXECUTORS) == ["process", "serial", "ray"]
    assert actions["workers"].type is int and actions["overlap_weight"].type is float
    assert len(flag_fields(FleetFlags)) == 11
    general = {f.name: f for f in dataclasses.fields(TraceFlags)}
    first = {a.dest: a for a in reversed(trace._actions)}  # --progress, not --no-progress
    for name in flag_fields(TraceFlags):
        action = first[name]
        option = general[name].metadata.get("flag") or f"--{name.replace('_', '-')}"
        assert action.option_strings == [option]
        assert action.default == general[name].default
        assert action.help == general[name].metadata["help"]
    assert actions["hash_name"].choices == sorted(HASH_FUNCTIONS)
    assert actions["mode"].choices == list(MODES) and actions["free_order"].choices == list(
        FREE_ORDERS
    )
    assert actions["one_pass"].const is False and actions["one_pass"].default is None
    off = actions["progress"]  # the second switch of one dest
    assert off.option_strings == ["--no-progress"] and off.const is False
    assert len(flag_fields(TraceFlags)) == 13 and len(flag_fields(OutputFlags)) == 3
