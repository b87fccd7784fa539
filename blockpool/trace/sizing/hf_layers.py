"""Each layer's attention in a Hugging Face ``config.json``, as vLLM 0.16.0
sees it (with the transformers 4.57 it runs with).

Two steps, as in vLLM:

1. **The config class** (``transformers/models/<type>/configuration_<type>.py``)
   fills what the file leaves out: ``layer_types`` (one of
   ``full_attention``, ``sliding_attention``, ``chunked_attention``,
   ``linear_attention`` a layer) and ``sliding_window``:

   * ``gemma2``, ``gpt_oss``: sliding when ``(i + 1) % 2`` (even layers),
     window 4096 / 128 by default;
   * ``gemma3_text`` (the text half of ``gemma3``): sliding when ``(i + 1) %
     sliding_window_pattern`` (6 by default), window 4096; with
     ``use_bidirectional_attention`` the window becomes ``window // 2 + 1``;
   * ``cohere2``: the same with a pattern of 4, window 4096;
   * ``olmo3``: sliding when ``(i + 1) % 4``, window 4096;
   * ``exaone4``: sliding when ``(i + 1) % sliding_window_pattern`` (4),
     window 4096;
   * ``qwen2``, ``qwen3``: ``sliding_window`` only with
     ``use_sliding_window`` (default false), and then sliding for layers
     ``i >= max_window_layers`` (28); ``qwen2_moe``, ``qwen3_moe``: the
     window only with ``use_sliding_window``, no ``layer_types``;
   * any other config with ``use_sliding_window`` false (the Qwen2-VL,
     Qwen2.5-VL and omni configs by default) has no window;
   * ``mistral``: ``sliding_window`` 4096 when the key is absent; ``mixtral``,
     ``phi3``, ``starcoder2``: none unless given;
   * ``llama4_text`` (the text half of ``llama4``): ``attention_chunk_size``
     8192 by default, chunked when ``no_rope_layers[i]`` (from
     ``no_rope_layer_interval`` 4: every layer but each fourth).

   Any other type keeps what the file says.  A ``layer_types`` given in the
   file wins everywhere.

2. **The model code and the cache config** (vLLM 0.16.0): ``Attention``
   (``model_executor/layers/attention/attention.py`` l. 212-217) takes a
   layer's ``per_layer_sliding_window`` when the model passes one, else
   ``CacheConfig.sliding_window``, which ``EngineArgs.create_engine_config``
   (``engine/arg_utils.py`` l. 1421-1426) sets to ``ModelConfig.get_sliding_window()``
   (``hf_text_config.sliding_window``) only when the model is not
   interleaved (``transformers_utils/config.py: is_interleaved``: more than
   one distinct ``layer_types`` entry).  So a non-interleaved model with a
   window has it on every layer, whatever its code.  For an interleaved one:

   * the models reading ``layer_types`` (``llama.py`` and what builds on it:
     llama, mistral, phi3; ``gemma2.py``, ``gemma3.py``, ``commandr.py`` for
     cohere2, ``exaone4.py``, ``olmo2.py`` for olmo3, and any type not named
     here) give a ``sliding_attention`` layer the window, the rest none;
   * ``gpt_oss.py`` gives the window to even layers (``layer_idx % 2 == 0``);
   * ``qwen2.py`` (and ``qwen3.py``, built on its model) refuses to load
     (``max_window_layers`` must equal ``num_hidden_layers``);
   * ``qwen2_moe.py``, ``qwen3_moe.py``, ``mixtral.py``, ``starcoder2.py``
     pass no per-layer window: every layer is full attention;
   * ``llama4.py`` makes a chunked layer chunked local attention
     (``attention_chunk_size``).

``--disable-sliding-window`` (``ModelConfig.disable_sliding_window``) sets
``hf_text_config.sliding_window = None`` before the model is built
(``config/model.py`` l. 608-611), so every layer is full attention, and
``_get_and_verify_max_len`` (l. 1920-1926) caps ``max_model_len`` at the
window when it is below the model's own length
(:mod:`blockpool.trace.sizing.model_len`).

Mamba, linear-attention and other non-attention layers, KV sharing across
layers and per-type head shapes are refused with the field that shows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from blockpool.trace.sizing.model_len import derived_max_model_len

LayerKind = Literal["full", "sliding", "chunked"]
# one layer: ("full", None), ("sliding", window) or ("chunked", chunk size)
LayerSpec = tuple[LayerKind, int | None]

_LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention"}

# (default window, pattern field, default pattern): sliding when (i + 1) % pattern
_PATTERNS: dict[str, tuple[int, str | None, int]] = {
    "gemma2": (4096, None, 2),
    "gpt_oss": (128, None, 2),
    "gemma3_text": (4096, "sliding_window_pattern", 6),
    "cohere2": (4096, "sliding_window_pattern", 4),
    "olmo3": (4096, None, 4),
    "exaone4": (4096, "sliding_window_pattern", 4),
}
_QWEN_LAYERED = {"qwen2", "qwen3"}  # use_sliding_window + max_window_layers
_QWEN_MOE = {"qwen2_moe", "qwen3_moe"}  # use_sliding_window, no layer_types
_DEFAULT_WINDOW = {"mistral": 4096}
# vLLM models that pass no per-layer window (interleaved -> all full attention)
_NO_PER_LAYER = {"qwen2_moe", "qwen3_moe", "mixtral", "starcoder2"}
# the text config a multimodal type builds when its text_config names no type
_TEXT_TYPES = {"gemma3": "gemma3_text", "llama4": "llama4_text"}

# fields that show layers this pool does not hold (state, not attention KV)
_NOT_ATTENTION = (
    "layers_block_type",
    "hybrid_override_pattern",
    "attn_layer_indices",
    "attn_layer_period",
    "attn_type_list",
    "linear_attn_config",
    "full_attn_idxs",
    "mamba_d_state",
    "mamba_expand",
    "ssm_state_size",
    "linear_num_key_heads",
    "num_kv_shared_layers",
)
_HEAD_SHAPE_PREFIXES = ("swa_", "sliding_window_head", "global_head_dim", "local_head_dim")


@dataclass(frozen=True)
class LayerAttention:
    """Every attention layer's spec, how it was derived, and the length cap."""

    layers: tuple[LayerSpec, ...]
    rule: str  # which derivation gave ``layers``
    max_model_len: int  # vLLM's default max_model_len (--disable-sliding-window's cap in)


def text_model_type(cfg: dict[str, Any], top: dict[str, Any]) -> str:
    """The model type of the text config (``gemma3`` -> ``gemma3_text``)."""
    t = cfg.get("model_type")
    if cfg is not top and (not isinstance(t, str) or t == top.get("model_type")):
        t = _TEXT_TYPES.get(str(top.get("model_type")), t)
    return str(t or "")


def _refuse_unmodelled(cfg: dict[str, Any]) -> None:
    for name in _NOT_ATTENTION:
        if cfg.get(name) not in (None, [], 0):
            raise ValueError(
                f"model config: {name} shows layers that are not plain attention (Mamba, "
                "linear attention or shared KV); vLLM gives them their own state, which this "
                "pool does not model"
            )
    for key in cfg:
        if key.startswith(_HEAD_SHAPE_PREFIXES) and cfg[key] is not None:
            raise ValueError(
                f"model config: {key} gives some layers their own KV shape; vLLM then pads "
                "pages to one size (unify_kv_cache_spec_page_size), which this planner "
                "does not model"
            )


def _positive(cfg: dict[str, Any], name: str, default: int | None) -> int | None:
    v = cfg.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"model config: {name} must be a positive integer or null, got {v!r}")
    return v


def _config_class(cfg: dict[str, Any], mt: str, n: int) -> tuple[list[str] | None, int | None, str]:
    """transformers' ``layer_types`` and ``sliding_window`` (and the rule's name)."""
    given = cfg.get("layer_types")
    if mt in _QWEN_LAYERED or mt in _QWEN_MOE:
        window = _positive(cfg, "sliding_window", 4096)
        if not cfg.get("use_sliding_window", False):
            window = None
        if mt in _QWEN_MOE or given is not None:
            return given, window, f"{mt}: use_sliding_window"
        first = _positive(cfg, "max_window_layers", 28)
        assert first is not None
        types = [
            "sliding_attention" if window is not None and i >= first else "full_attention"
            for i in range(n)
        ]
        return types, window, f"{mt}: use_sliding_window, max_window_layers {first}"
    if mt == "llama4_text":
        # llama4.py reads no_rope_layers, not layer_types: chunked where a layer has RoPE
        nope = cfg.get("no_rope_layers")
        if not nope:
            every = _positive(cfg, "no_rope_layer_interval", 4)
            assert every is not None
            nope = [int((i + 1) % every != 0) for i in range(n)]
        if not isinstance(nope, list) or len(nope) != n:
            raise ValueError(f"model config: no_rope_layers must list {n} layers")
        types = ["chunked_attention" if x else "full_attention" for x in nope]
        return types, _positive(cfg, "sliding_window", None), "llama4: no_rope_layers"
    if mt in _PATTERNS:
        default, field, every = _PATTERNS[mt]
        window = _positive(cfg, "sliding_window", default)
        if mt == "gemma3_text" and window is not None and cfg.get("use_bidirectional_attention"):
            window = window // 2 + 1
        if given is not None:
            return given, window, f"{mt}: layer_types"
        if field is not None:
            p = cfg.get(field, every)
            if isinstance(p, bool) or not isinstance(p, int) or p < 1:
                raise ValueError(
                    f"model config: {field} {p!r} is not a layer count; give layer_types"
                )
            every = p
        if mt == "exaone4" and window is None:
            raise ValueError("model config: exaone4 without sliding_window needs layer_types")
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
        name = f"{field} {every}" if field else f"every {every}"
        return types, window, f"{mt}: sliding unless (i + 1) % {every} == 0 ({name})"
    window = _positive(cfg, "sliding_window", _DEFAULT_WINDOW.get(mt))
    # the Qwen family's other configs (qwen2_vl, qwen2_5_vl, the omni ones)
    # keep the window only with use_sliding_window, false by default
    if not cfg.get("use_sliding_window", not mt.startswith(("qwen2", "qwen3"))):
        window = None
    if given is None:
        for field in ("sliding_window_pattern", "max_window_layers"):
            if cfg.get(field) is not None and window is not None:
                raise ValueError(
                    f"model config: {field} for model_type {mt or '(none)'!r}, whose layer "
                    "pattern this planner does not know; give layer_types"
                )
    return given, window, (f"{mt}: layer_types" if given is not None else f"{mt or 'model'}")


def layer_attention(
    cfg: dict[str, Any],
    top: dict[str, Any],
    num_layers: int,
    *,
    disable_sliding_window: bool = False,
) -> LayerAttention:
    """Each layer's attention as vLLM 0.16.0 builds it (ValueError: refused)."""
    _refuse_unmodelled(cfg)
    mt = text_model_type(cfg, top)
    types, window, rule = _config_class(cfg, mt, num_layers)
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ValueError(f"model config: layer_types must list {num_layers} layer types")
        bad = sorted({str(t) for t in types} - _LAYER_TYPES)
        if bad:
            raise ValueError(
                f"model config: layer_types {', '.join(bad)}: not attention this pool holds "
                "(known: full_attention, sliding_attention, chunked_attention)"
            )
    cap = None
    if disable_sliding_window and window is not None:
        cap, window = window, None
    interleaved = types is not None and len(set(types)) > 1
    model_window = None if interleaved else window
    chunk = _positive(cfg, "attention_chunk_size", None)
    if mt == "llama4_text":
        chunk = _positive(cfg, "attention_chunk_size", 8192)
    if interleaved and mt in _QWEN_LAYERED:
        raise ValueError(
            f"model config: {mt} with a sliding window on some layers only (max_window_layers "
            "below num_hidden_layers): vLLM 0.16 refuses to load it"
        )
    out: list[LayerSpec] = []
    for i in range(num_layers):
        t = None if types is None else types[i]
        own_window: int | None = None
        if interleaved and mt not in _NO_PER_LAYER:
            if mt == "gpt_oss":
                own_window = window if i % 2 == 0 else None
            elif t == "sliding_attention":
                own_window = window
        if t == "chunked_attention" and chunk is not None:
            out.append(("chunked", chunk))
        elif (own_window or model_window) is not None:
            out.append(("sliding", own_window or model_window))
        else:
            out.append(("full", None))
    if not interleaved and window is not None:
        rule = f"{rule}; sliding_window {window} on every layer (not interleaved)"
    elif disable_sliding_window:
        rule = f"{rule}; --disable-sliding-window"
    return LayerAttention(tuple(out), rule, derived_max_model_len(cfg, mt, cap))
