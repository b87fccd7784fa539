"""Hugging Face ``config.json`` contents of real models (the fields the KV
layout reads, values as published), shared by the unit tests and the vLLM
0.16.0 parity test."""

from __future__ import annotations

from typing import Any

GEMMA3_27B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    },
}
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "torch_dtype": "bfloat16",
}
MISTRAL_7B_V01: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "sliding_window": 4096,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}
GEMMA2_9B: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 3584,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "sliding_window": 4096,
    "max_position_embeddings": 8192,
    "torch_dtype": "float32",
}
QWEN2_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "max_window_layers": 28,
    "use_sliding_window": False,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
QWEN2_7B_SLIDING: dict[str, Any] = {**QWEN2_7B, "use_sliding_window": True, "sliding_window": 4096}
COMMAND_R7B: dict[str, Any] = {
    "architectures": ["Cohere2ForCausalLM"],
    "model_type": "cohere2",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "sliding_window": 4096,
    "sliding_window_pattern": 4,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
LLAMA4_SCOUT: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text",
        "hidden_size": 5120,
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "attention_chunk_size": 8192,
        "max_position_embeddings": 10485760,
    },
}

LLAMA_3B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 3072,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
# layer patterns no published model has, for vLLM's group_size rule: 13 full
# beside 12 sliding (below 1.25x: group_size 13), 30 full beside 20 sliding
LLAMA_13_FULL_12_SLIDING: dict[str, Any] = {
    **LLAMA_3B,
    "num_hidden_layers": 25,
    "sliding_window": 2048,
    "layer_types": ["full_attention", "sliding_attention"] * 12 + ["full_attention"],
}
LLAMA_30_FULL_20_SLIDING: dict[str, Any] = {
    **LLAMA_3B,
    "num_hidden_layers": 50,
    "sliding_window": 512,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"] * 10
    + ["full_attention", "full_attention"] * 10,
}

GEMMA3_1B: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 1152,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}
PHI3_MINI_4K: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "hidden_size": 3072,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "sliding_window": 2047,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "sliding_window": None,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}
STARCODER2_7B: dict[str, Any] = {
    "architectures": ["Starcoder2ForCausalLM"],
    "model_type": "starcoder2",
    "hidden_size": 4608,
    "num_hidden_layers": 32,
    "num_attention_heads": 36,
    "num_key_value_heads": 4,
    "sliding_window": 4096,
    "max_position_embeddings": 16384,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B_SLIDING: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "use_sliding_window": True,
    "sliding_window": 4096,
    "max_window_layers": 48,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}
# the config classes' own layer patterns (no layer_types in the file)
OLMO3_7B: dict[str, Any] = {
    "architectures": ["Olmo3ForCausalLM"],
    "model_type": "olmo3",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "sliding_window": 4096,
    "max_position_embeddings": 65536,
    "torch_dtype": "bfloat16",
}
EXAONE4_32B: dict[str, Any] = {
    "architectures": ["Exaone4ForCausalLM"],
    "model_type": "exaone4",
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "sliding_window": 4096,
    "sliding_window_pattern": 4,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}

# name -> config, for the parity test (the ones vLLM groups without refusing)
GROUPED = {
    "gemma3-27b": GEMMA3_27B,
    "gpt-oss-20b": GPT_OSS_20B,
    "mistral-7b-v0.1": MISTRAL_7B_V01,
    "gemma2-9b": GEMMA2_9B,
    "qwen2-7b": QWEN2_7B,
    "qwen2-7b-sliding": QWEN2_7B_SLIDING,
    "command-r7b": COMMAND_R7B,
    "llama-13-12": LLAMA_13_FULL_12_SLIDING,
    "llama-30-20": LLAMA_30_FULL_20_SLIDING,
    "gemma3-1b": GEMMA3_1B,
    "phi3-mini-4k": PHI3_MINI_4K,
    "mixtral-8x7b": MIXTRAL_8X7B,
    "starcoder2-7b": STARCODER2_7B,
    "qwen3-30b-a3b-sliding": QWEN3_30B_A3B_SLIDING,
    "olmo3-7b": OLMO3_7B,
    "exaone4-32b": EXAONE4_32B,
}
