"""A model's KV layout from its Hugging Face ``config.json``, as vLLM 0.16.0
derives it (blockpool/trace/sizing/capacity.py says how the layout sizes the
pool): layers, KV heads per GPU (``ModelConfig.get_num_kv_heads``: ``max(1,
total_kv_heads // tensor_parallel_size)``, 1 under MLA), head size, the KV
dtype (``auto``: the model's, a float32 checkpoint downcast to 16 bits,
``_resolve_auto_dtype``), MLA's latent vector (``kv_lora_rank +
qk_rope_head_dim``), and the attention groups (sliding windows:
blockpool/trace/sizing/hf_layers.py and kv_groups.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from blockpool.core.attention import FULL_ATTENTION
from blockpool.trace.sizing.capacity import KV_CACHE_DTYPES, KVLayout
from blockpool.trace.sizing.hf_layers import layer_attention
from blockpool.trace.sizing.kv_groups import kv_cache_groups

# the model's dtype under --dtype auto: vLLM runs a float32 checkpoint in the
# GPU's preferred 16-bit type (config/model.py, _resolve_auto_dtype: "Downcast
# for float32 models"), so its KV cache is 2 bytes an element too
_MODEL_DTYPES = {"float32": 2, "float16": 2, "bfloat16": 2, "float": 2, "half": 2}
_MLA_TYPES = {
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "deepseek_mtp",
    "glm_moe_dsa",
    "glm4_moe_lite",
    "kimi_k2",
    "kimi_linear",
    "longcat_flash",
    "pangu_ultra_moe",
}


def _int_field(cfg: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for n in names:
        v = cfg.get(n)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model config: {n} must be a positive integer, got {v!r}")
            return v
    return None


def layout_from_config(
    cfg: dict[str, Any],
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    source: str = "",
    *,
    disable_sliding_window: bool = False,
    disable_hybrid_kv_cache_manager: bool = False,
) -> KVLayout:
    """The KV layout vLLM 0.16 derives from a Hugging Face ``config.json``."""
    if tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size must be positive, got {tensor_parallel_size}")
    top = cfg
    text = cfg.get("text_config")
    if isinstance(text, dict):
        cfg = {**text, "torch_dtype": text.get("torch_dtype") or cfg.get("torch_dtype")}
    layers = _int_field(cfg, ("num_hidden_layers", "n_layer", "num_layers", "n_layers"))
    if layers is None:
        raise ValueError("model config: no num_hidden_layers")
    if layers > 4096:
        raise ValueError(f"model config: num_hidden_layers {layers} is over 4096")
    per_layer = layer_attention(cfg, top, layers, disable_sliding_window=disable_sliding_window)
    grouped = kv_cache_groups(per_layer.layers, disable_hybrid=disable_hybrid_kv_cache_manager)
    one = len(grouped.attention) == 1 and grouped.attention[0][0] == FULL_ATTENTION

    def with_groups(base: KVLayout) -> KVLayout:
        return replace(
            base,
            attention=() if one else grouped.attention,
            layers_per_group=() if one else tuple(len(g) for g in grouped.layers),
            rule=per_layer.rule,
            max_model_len=per_layer.max_model_len,
            hybrid_manager=not disable_hybrid_kv_cache_manager,
        )

    heads = _int_field(cfg, ("num_attention_heads", "n_head", "num_heads"))
    mla = cfg.get("model_type") in _MLA_TYPES and cfg.get("kv_lora_rank") is not None
    if kv_cache_dtype == "auto":
        name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
        if name not in _MODEL_DTYPES:
            raise ValueError(f"model config: unknown torch_dtype {name!r}; give --kv-cache-dtype")
        dtype_bytes = _MODEL_DTYPES[name]
    elif kv_cache_dtype in KV_CACHE_DTYPES:
        dtype_bytes = KV_CACHE_DTYPES[kv_cache_dtype]
    else:
        known = ", ".join(["auto", *KV_CACHE_DTYPES])
        raise ValueError(f"unknown --kv-cache-dtype {kv_cache_dtype!r} (known: {known})")
    if mla:
        if not one:
            raise ValueError("model config: MLA with a sliding window (vLLM refuses it)")
        rank = _int_field(cfg, ("kv_lora_rank",))
        rope = cfg.get("qk_rope_head_dim") or 0
        assert rank is not None
        return with_groups(
            KVLayout(layers, 1, rank + int(rope), dtype_bytes, mla=True, source=source, vectors=1)
        )
    head_size = _int_field(cfg, ("head_dim", "hidden_size_per_head"))
    if head_size is None:
        hidden = _int_field(cfg, ("hidden_size", "n_embd", "d_model"))
        if hidden is None or heads is None:
            raise ValueError("model config: no head_dim, nor hidden_size and num_attention_heads")
        head_size = hidden // heads
    kv = _int_field(cfg, ("n_head_kv", "num_kv_heads", "num_key_value_heads",
                          "multi_query_group_num"))  # fmt: skip
    if kv is None:
        if heads is None:
            raise ValueError("model config: no num_key_value_heads nor num_attention_heads")
        kv = heads
    return with_groups(
        KVLayout(layers, max(1, kv // tensor_parallel_size), head_size, dtype_bytes, source=source)
    )


def read_model_config(
    path: str | Path,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    **flags: bool,
) -> KVLayout:
    """:func:`layout_from_config` of a ``config.json`` file (ValueError when bad)."""
    p = Path(path)
    try:
        if p.stat().st_size > 4 << 20:
            raise ValueError(f"{p}: a model config over 4 MiB")
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read model config {p}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}: a model config is a JSON object")
    return layout_from_config(cfg, kv_cache_dtype, tensor_parallel_size, str(p), **flags)
