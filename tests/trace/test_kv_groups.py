"""Sliding-window and hybrid models in the capacity planner: each layer's
attention derived from real configs, vLLM 0.16.0's KV-cache groups, and the
block count of a byte budget (the figures worked by hand from the configs)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from app.cli import main
from blockpool.core.attention import FULL_ATTENTION, SLIDING_WINDOW
from blockpool.trace.sizing.capacity import (
    flat_bytes,
    parse_capacity_list,
    parse_kv_cache_groups,
)
from blockpool.trace.sizing.hf_layers import layer_attention
from blockpool.trace.sizing.kv_groups import kv_cache_groups
from blockpool.trace.sizing.model_config import layout_from_config
from tests.trace.helpers import row, rows_to_lines
from tests.trace.hf_configs import (
    COMMAND_R7B,
    EXAONE4_32B,
    GEMMA2_9B,
    GEMMA3_1B,
    GEMMA3_27B,
    GPT_OSS_20B,
    LLAMA4_SCOUT,
    LLAMA_13_FULL_12_SLIDING,
    LLAMA_30_FULL_20_SLIDING,
    MISTRAL_7B_V01,
    MIXTRAL_8X7B,
    OLMO3_7B,
    PHI3_MINI_4K,
    QWEN2_7B,
    QWEN2_7B_SLIDING,
    QWEN3_30B_A3B_SLIDING,
    STARCODER2_7B,
)

GIB = 1 << 30
SW, FULL = SLIDING_WINDOW, FULL_ATTENTION


def test_gemma3_27b_six_sliding_groups_and_one_full() -> None:
    lay = layout_from_config(GEMMA3_27B)
    # layers 5, 11, ..., 59 are global: 10 full, 52 sliding; group_size 10
    assert lay.attention == ((SW, 1024),) * 6 + ((FULL, None),)
    assert lay.layers_per_group == (9, 9, 9, 9, 8, 8, 10) and lay.group_size == 10
    # page: 2 x 16 heads x 128 x 2 bytes x 16 tokens = 131072; 8 GiB / page / 10
    assert lay.block_bytes(16) == 131072 * 10
    assert lay.num_blocks(8 * GIB, 16) == 65536 // 10 == 6553
    assert lay.num_blocks(16 * GIB, 16) == 13107
    assert lay.kv_cache_tokens(6553, 16) == 6553 // 7 * 16 == 14976
    assert lay.bytes_per_token == 8192 * 10 * 7
    specs = lay.group_specs(16)
    assert [s.sliding_window for s in specs] == [1024] * 6 + [None]
    groups = kv_cache_groups(layer_attention(GEMMA3_27B["text_config"], GEMMA3_27B, 62).layers)
    assert groups.layers[-1] == tuple(range(5, 62, 6))
    sliding = [i for i in range(62) if (i + 1) % 6]
    assert groups.layers[0] == tuple(sliding[0::6]) and groups.layers[5] == tuple(sliding[5::6])


def test_gpt_oss_20b_two_groups_of_twelve() -> None:
    lay = layout_from_config(GPT_OSS_20B)
    assert lay.attention == ((SW, 128), (FULL, None)) and lay.layers_per_group == (12, 12)
    # page 2 x 8 x 64 x 2 x 16 = 32768
    assert lay.num_blocks(8 * GIB, 16) == 262144 // 12 == 21845
    assert lay.num_blocks(16 * GIB, 16) == 43690
    assert lay.kv_cache_tokens(21845, 16) == 10922 * 16
    # yarn: 4096 positions x 32, even with the window's cap (vLLM scales after it)
    assert lay.max_model_len == 131072
    assert layout_from_config(GPT_OSS_20B, disable_sliding_window=True).max_model_len == 131072
    tp4 = layout_from_config(GPT_OSS_20B, tensor_parallel_size=4)
    assert tp4.num_kv_heads == 2 and tp4.num_blocks(8 * GIB, 16) == 1048576 // 12
    fp8 = layout_from_config(GPT_OSS_20B, kv_cache_dtype="fp8")
    assert fp8.num_blocks(8 * GIB, 16) == 524288 // 12


def test_mistral_v01_is_one_sliding_group_even_without_the_hybrid_manager() -> None:
    lay = layout_from_config(MISTRAL_7B_V01)
    assert lay.attention == ((SW, 4096),) and lay.layers_per_group == (32,)
    assert lay.max_model_len == 32768
    assert lay.num_blocks(8 * GIB, 16) == (8 * GIB) // 65536 // 32 == 4096
    off = layout_from_config(MISTRAL_7B_V01, disable_hybrid_kv_cache_manager=True)
    assert off.attention == ((SW, 4096),)  # uniform: unify_hybrid leaves it
    # the window absent from the file: MistralConfig's default 4096
    no_key = {k: v for k, v in MISTRAL_7B_V01.items() if k != "sliding_window"}
    assert layout_from_config(no_key).attention == ((SW, 4096),)
    assert layout_from_config({**MISTRAL_7B_V01, "sliding_window": None}).attention == ()
    full = layout_from_config(MISTRAL_7B_V01, disable_sliding_window=True)
    assert full.attention == () and full.max_model_len == 4096
    assert full.num_blocks(8 * GIB, 16) == 4096


def test_gemma2_9b_alternates_and_the_hybrid_manager_off_makes_one_group() -> None:
    lay = layout_from_config(GEMMA2_9B)  # float32 checkpoint: vLLM runs it in bf16
    assert lay.dtype_bytes == 2
    assert lay.attention == ((SW, 4096), (FULL, None)) and lay.layers_per_group == (21, 21)
    # page 2 x 8 x 256 x 2 x 16 = 131072
    assert lay.num_blocks(8 * GIB, 16) == 65536 // 21 == 3120
    assert lay.num_blocks(16 * GIB, 16) == 131072 // 21 == 6241
    off = layout_from_config(GEMMA2_9B, disable_hybrid_kv_cache_manager=True)
    assert off.attention == () and off.group_size == 42
    assert off.num_blocks(8 * GIB, 16) == 65536 // 42 == 1560
    assert not off.to_json()["hybrid_kv_cache_manager"]
    nosw = layout_from_config(GEMMA2_9B, disable_sliding_window=True)
    assert nosw.attention == () and nosw.max_model_len == 4096


def test_qwen2_window_only_with_use_sliding_window() -> None:
    assert layout_from_config(QWEN2_7B).attention == ()
    assert layout_from_config(QWEN2_7B).num_blocks(8 * GIB, 16) == 262144 // 28
    on = layout_from_config(QWEN2_7B_SLIDING)
    # max_window_layers == num_hidden_layers: layer_types all full, so not
    # interleaved, and CacheConfig.sliding_window puts the window on every layer
    assert on.attention == ((SW, 4096),) and on.layers_per_group == (28,)
    assert on.num_blocks(8 * GIB, 16) == 9362
    vl = {
        **QWEN2_7B,
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    }
    assert layout_from_config(vl).attention == ()  # use_sliding_window false: no window
    vl.pop("use_sliding_window")
    assert layout_from_config(vl).attention == ()  # and false by default for the family
    with pytest.raises(ValueError, match="max_window_layers for model_type 'qwen2_5_vl'"):
        layout_from_config({**vl, "use_sliding_window": True})  # a pattern not known here
    with pytest.raises(ValueError, match="max_window_layers below num_hidden_layers"):
        layout_from_config({**QWEN2_7B_SLIDING, "max_window_layers": 14})


def test_command_r7b_three_sliding_groups_and_one_full() -> None:
    lay = layout_from_config(COMMAND_R7B)
    assert lay.attention == ((SW, 4096),) * 3 + ((FULL, None),)
    assert lay.layers_per_group == (8, 8, 8, 8)
    assert lay.num_blocks(8 * GIB, 16) == 131072 // 8 == 16384
    assert lay.kv_cache_tokens(16384, 16) == 65536
    doc = lay.to_json()
    assert doc["num_groups"] == 4 and doc["group_size"] == 8
    assert doc["kv_cache_groups"][0] == {"attention": SW, "sliding_window": 4096, "layers": 8}
    assert "sliding_window_pattern 4" in doc["layer_rule"]


def test_more_config_classes_and_model_level_windows() -> None:
    g1 = layout_from_config(GEMMA3_1B)  # 4 full (5, 11, 17, 23), 22 sliding
    assert g1.attention == ((SW, 512),) * 6 + ((FULL, None),)
    assert g1.layers_per_group == (4, 4, 4, 4, 3, 3, 4)
    assert g1.num_blocks(8 * GIB, 16) == (8 * GIB) // 16384 // 4 == 131072
    olmo = layout_from_config(OLMO3_7B)  # OLMo 3's default: every fourth layer full
    assert olmo.attention == ((SW, 4096),) * 3 + ((FULL, None),)
    assert olmo.num_blocks(8 * GIB, 16) == 32768 // 8
    exa = layout_from_config(EXAONE4_32B)
    assert exa.attention == ((SW, 4096),) * 3 + ((FULL, None),) and exa.group_size == 16
    assert exa.num_blocks(8 * GIB, 16) == 131072 // 16
    # not interleaved: CacheConfig.sliding_window on every layer
    phi = layout_from_config(PHI3_MINI_4K)
    assert phi.attention == ((SW, 2047),) and phi.num_blocks(8 * GIB, 16) == 43690 // 32
    assert layout_from_config(STARCODER2_7B).attention == ((SW, 4096),)
    moe = layout_from_config(QWEN3_30B_A3B_SLIDING)
    assert moe.attention == ((SW, 4096),) and moe.num_blocks(8 * GIB, 16) == 262144 // 48
    assert layout_from_config(MIXTRAL_8X7B).attention == ()
    # qwen2_moe / mixtral code passes no per-layer window: interleaved -> all full
    mixed = {**MIXTRAL_8X7B, "sliding_window": 4096}
    mixed["layer_types"] = ["sliding_attention", "full_attention"] * 16
    assert layout_from_config(mixed).attention == ()


def test_group_size_rule_pads_the_last_groups() -> None:
    # 13 full and 12 sliding: 13 < 12 x 1.25, so one group of each, 13 layers
    a = layout_from_config(LLAMA_13_FULL_12_SLIDING)
    assert a.attention == ((FULL, None), (SW, 2048)) and a.layers_per_group == (13, 12)
    assert a.num_blocks(8 * GIB, 16) == (8 * GIB) // 65536 // 13 == 10082
    # 30 full and 20 sliding: group_size 20, the full layers in 2 groups of 15
    b = layout_from_config(LLAMA_30_FULL_20_SLIDING)
    assert b.attention == ((FULL, None), (FULL, None), (SW, 512))
    assert b.layers_per_group == (15, 15, 20) and b.num_blocks(8 * GIB, 16) == 131072 // 20


def test_llama4_chunked_attention_is_refused_unless_the_hybrid_manager_is_off() -> None:
    with pytest.raises(ValueError, match="attention_chunk_size"):
        layout_from_config(LLAMA4_SCOUT)
    off = layout_from_config(LLAMA4_SCOUT, disable_hybrid_kv_cache_manager=True)
    assert off.attention == () and off.group_size == 48
    assert off.num_blocks(8 * GIB, 16) == 131072 // 48 == 2730
    text = {**LLAMA4_SCOUT["text_config"], "attention_chunk_size": None}
    assert layout_from_config({**LLAMA4_SCOUT, "text_config": text}).attention == ()


def test_unknown_patterns_and_other_layers_are_refused() -> None:
    odd = {**MISTRAL_7B_V01, "model_type": "newmodel", "sliding_window_pattern": 3}
    with pytest.raises(ValueError, match="sliding_window_pattern for model_type 'newmodel'"):
        layout_from_config(odd)
    given = {**odd, "layer_types": ["sliding_attention", "full_attention"] * 16}
    assert layout_from_config(given).attention == ((SW, 4096), (FULL, None))
    lin = {**MISTRAL_7B_V01, "layer_types": ["linear_attention"] * 32}
    with pytest.raises(ValueError, match="linear_attention"):
        layout_from_config(lin)
    with pytest.raises(ValueError, match="layers_block_type"):
        layout_from_config({**MISTRAL_7B_V01, "layers_block_type": ["mamba"] * 32})
    with pytest.raises(ValueError, match="swa_head_dim"):
        layout_from_config({**GPT_OSS_20B, "swa_head_dim": 128})
    with pytest.raises(ValueError, match="must list 32"):
        layout_from_config({**MISTRAL_7B_V01, "layer_types": ["full_attention"]})
    with pytest.raises(ValueError, match="sliding_window must be a positive"):
        layout_from_config({**MISTRAL_7B_V01, "sliding_window": "4k"})


def test_kv_cache_groups_flag_syntax() -> None:
    assert parse_kv_cache_groups("full") == ()
    assert parse_kv_cache_groups("sliding:4096x2, full") == ((SW, 4096), (SW, 4096), (FULL, None))
    for bad in ("sliding", "sliding:0", "full:5", "lossy", "fullx0", ""):
        with pytest.raises(ValueError, match="--kv-cache-groups"):
            parse_kv_cache_groups(bad)
    lay = flat_bytes(64, parse_kv_cache_groups("sliding:128,full"))
    a, b = parse_capacity_list("64KiB,1024", 16, lay)
    # 64 B a token in each group: 64 KiB / 1 KiB blocks; 1024 tokens as vLLM
    # logs them (num_blocks // 2 groups * 16) is 128 blocks
    assert (a.blocks, a.kv_cache_tokens, a.usable_tokens) == (64, 512, 31 * 16)
    assert b.blocks == 128 and b.kv_cache_tokens == 1024


def _trace(tmp_path: Path) -> Path:
    rows = [row(i, [1, 2, 3, 100 + i % 4], 16 * 4 * 3 + 20, 2) for i in range(12)]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(rows_to_lines(rows)) + "\n")
    return p


def test_cli_hybrid_model_json_and_flag_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(GPT_OSS_20B))
    base = ["trace", str(_trace(tmp_path)), "--tokens-per-id", "64", "--quiet"]
    assert main([*base, "--model-config", str(cfg), "--capacity", "8GiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    kv = doc["kv_layout"]
    assert kv["num_groups"] == 2 and kv["group_size"] == 12 and kv["block_bytes"] == 32768 * 12
    assert [g["attention"] for g in kv["kv_cache_groups"]] == [SW, FULL]
    (res,) = doc["results"]
    assert res["blocks"] == 21845 and res["kv_cache_tokens"] == 174752
    assert res["usable_tokens"] == 21844 // 2 * 16 and res["bytes"] == 21845 * 32768 * 12
    argv = [*base, "--model-config", str(cfg), "--capacity", "8GiB", "--json"]
    assert main([*argv, "--disable-hybrid-kv-cache-manager"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["kv_layout"]["num_groups"] == 1 and off["results"][0]["blocks"] == 262144 // 24
    # tokens as vLLM logs them, --capacity or --capacity-tokens: 3 groups x 1024 // 16
    groups = ["--kv-cache-groups", "sliding:1024x2,full", "--json"]
    for flag in ("--capacity", "--capacity-tokens"):
        assert main([*base, *groups, flag, "1024"]) == 0
        (tok,) = json.loads(capsys.readouterr().out)["results"]
        assert (tok["blocks"], tok["kv_cache_tokens"], tok["usable_tokens"]) == (192, 1024, 1008)
        assert tok["bytes"] is None
    assert (
        main([*base, "--kv-cache-groups", "sliding:1024,full", "--capacity", "1024", "--csv"]) == 0
    )
    head, first = list(csv.reader(io.StringIO(capsys.readouterr().out)))[:2]
    assert dict(zip(head, first, strict=True))["kv_cache_tokens"] == "1024"
    assert main([*base, "--kv-cache-groups", "sliding:0", "--capacity", "4096"]) == 2
    assert "--kv-cache-groups" in capsys.readouterr().err
    assert main([*base, "--kv-cache-groups", "full,sliding:64", "--capacity", "1GiB"]) == 2
    assert "--bytes-per-token" in capsys.readouterr().err
    both = [*base, "--model-config", str(cfg), "--kv-cache-groups", "full"]
    assert main(both) == 2
    assert "--kv-cache-groups is for runs without --model-config" in capsys.readouterr().err
    assert main([*base, "--bytes-per-token", "64", "--disable-sliding-window"]) == 2
    assert "--disable-sliding-window acts on a --model-config" in capsys.readouterr().err
    llama4 = tmp_path / "llama4.json"
    llama4.write_text(json.dumps(LLAMA4_SCOUT))
    assert main([*base, "--model-config", str(llama4), "--capacity", "8GiB"]) == 2
    assert "attention_chunk_size" in capsys.readouterr().err


def test_capacity_blocks_over_groups_is_num_gpu_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--capacity-blocks`` names pool sizes in blocks: over three groups 192
    blocks stay 192 (tokens are what groups multiply)."""
    base = ["trace", str(_trace(tmp_path)), "--tokens-per-id", "64", "--quiet", "--json"]
    groups = ["--kv-cache-groups", "sliding:1024x2,full"]
    assert main([*base, *groups, "--capacity-blocks", "192,inf"]) == 0
    got, inf = json.loads(capsys.readouterr().out)["results"]
    assert (got["blocks"], got["kv_cache_tokens"], got["usable_tokens"]) == (192, 1024, 1008)
    assert got["capacity"] == "192b" and inf["blocks"] is None
    assert main([*base, "--capacity-blocks", "100"]) == 0  # one group: the same blocks
    (plain,) = json.loads(capsys.readouterr().out)["results"]
    assert (plain["blocks"], plain["capacity_tokens"], plain["capacity"]) == (100, 1600, "100b")
