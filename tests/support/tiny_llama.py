"""The tiny Llama the real-engine tests start vLLM with (``--load-format
dummy``: random weights, no download): 2 layers, hidden 128, 2 KV heads,
vocab 32000."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def tiny_llama(max_positions: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 32000,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def write_tiny_llama(folder: Path, max_positions: int) -> Path:
    """``folder`` holding the model's config.json (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(tiny_llama(max_positions)))
    return folder
