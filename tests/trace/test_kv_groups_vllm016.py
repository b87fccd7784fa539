"""The planner's KV-cache groups and block counts against vLLM 0.16.0's own
(``bench/parity/kvgroups016.py``: vLLM's ``ModelConfig`` of each config, the
per-layer specs its model code builds, ``get_kv_cache_groups``,
``get_kv_cache_config_from_groups`` and the logged KV cache size), for real
configs at several budgets, tensor-parallel sizes, KV dtypes and flags."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from blockpool.trace.sizing.hf_layers import layer_attention
from blockpool.trace.sizing.kv_groups import kv_cache_groups
from blockpool.trace.sizing.model_config import layout_from_config
from tests.support.cli import run_tool
from tests.trace.hf_configs import GROUPED
from tests.vllm_envs import REPO, vllm016_python

BUDGETS = [8 << 30, 16 << 30, 79_456_123_457, (1 << 30) + 12345]
# (tp, kv cache dtype, block size, hybrid manager off, sliding window off)
VARIANTS = [
    (1, "auto", 16, False, False),
    (2, "fp8", 32, False, False),
    (8, "auto", 16, True, False),
    (1, "auto", 64, False, True),
]


def _cases() -> list[dict[str, Any]]:
    out = []
    for name, cfg in GROUPED.items():
        for k, (tp, dtype, bs, hybrid_off, sw_off) in enumerate(VARIANTS):
            out.append(
                {
                    "name": f"{name}-{k}",
                    "config": cfg,
                    "tp": tp,
                    "kv_cache_dtype": dtype,
                    "block_size": bs,
                    "budgets": BUDGETS,
                    "disable_hybrid": hybrid_off,
                    "disable_sliding_window": sw_off,
                }
            )
    return out


def _ours(case: dict[str, Any]) -> dict[str, Any]:
    cfg = case["config"]
    flags = {
        "disable_sliding_window": case["disable_sliding_window"],
        "disable_hybrid_kv_cache_manager": case["disable_hybrid"],
    }
    lay = layout_from_config(cfg, case["kv_cache_dtype"], case["tp"], **flags)
    text = cfg.get("text_config", cfg)
    per_layer = layer_attention(
        text, cfg, text["num_hidden_layers"], disable_sliding_window=flags["disable_sliding_window"]
    )
    grouped = kv_cache_groups(per_layer.layers, disable_hybrid=case["disable_hybrid"])
    specs = lay.group_specs(case["block_size"])
    assert [(s.kind, s.sliding_window) for s in specs] == (
        [("full_attention", None)] if not lay.attention else list(grouped.attention)
    )
    bs = case["block_size"]
    blocks = [lay.num_blocks(b, bs) for b in case["budgets"]]
    return {
        "groups": [
            ["full" if kind == "full_attention" else kind, window, list(idx)]
            for (kind, window), idx in zip(grouped.attention, grouped.layers, strict=True)
        ],
        "page_size": lay.page_bytes * bs,
        "num_blocks": blocks,
        "tokens": [lay.kv_cache_tokens(n, bs) for n in blocks],
        "max_model_len": lay.max_model_len,
    }


@pytest.mark.vllm016
def test_groups_and_block_counts_equal_vllm016s(tmp_path: Path) -> None:
    python = vllm016_python()
    cases = _cases()
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    cmd = [
        python,
        str(REPO / "bench/parity/kvgroups016.py"),
        str(tmp_path / "cases.json"),
        "--hf-home",
        str(tmp_path / "hf"),
    ]
    out = run_tool(cmd, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900)
    theirs = json.loads(next(ln for ln in out.splitlines() if ln.startswith("[{")))
    assert len(theirs) == len(cases)
    for case, vllm in zip(cases, theirs, strict=True):
        mine = _ours(case)
        for key in ("groups", "page_size", "num_blocks", "tokens", "max_model_len"):
            assert mine[key] == vllm[key], (case["name"], key, mine[key], vllm[key])
    hybrid = [v for v in theirs if len(v["groups"]) > 1]
    assert len(hybrid) == 18  # gemma3 x2, gpt-oss, gemma2, command-r, 2 llamas, olmo3, exaone4
