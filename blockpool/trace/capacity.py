"""Pool sizes in memory: bytes, a model's KV layout, and vLLM's block count.

vLLM 0.16.0 sizes its pool from a byte budget per GPU in
``vllm/v1/core/kv_cache_utils.py``: ``get_kv_cache_config_from_groups`` puts
every full-attention layer of a uniform model in one KV cache group and
calls ``get_num_blocks``, which computes::

    num_blocks = int(available_memory // page_size // num_layers)

with ``page_size`` the bytes of one block of one layer
(``vllm/v1/kv_cache_interface.py``): ``AttentionSpec.real_page_size_bytes``
``= 2 * block_size * num_kv_heads * head_size * dtype_size`` (K and V);
``MLAAttentionSpec.real_page_size_bytes`` ``= block_size * 1 * (kv_lora_rank
+ qk_rope_head_dim) * dtype_size`` (one latent vector per token, no separate
V).  ``num_kv_heads`` is per GPU: ``ModelConfig.get_num_kv_heads`` gives
``max(1, total_kv_heads // tensor_parallel_size)``, and 1 under MLA (the
latent cache is replicated on every rank).  ``num_blocks`` counts the null
block, so a pool holds ``(num_blocks - 1) * block_size`` usable tokens.

A capacity given in bytes is that budget per GPU (vLLM's
``--kv-cache-memory-bytes``).  With ``--bytes-per-token N`` instead of a
model, a block is ``N * block_size`` bytes and ``num_blocks = bytes // (N *
block_size)``.

Sliding-window layers change the pool (vLLM's hybrid allocator splits the
layers into groups that share the blocks, and a sliding-window group frees
blocks outside its window): a config where a window applies to some layer
is refused with the reason, since the replay models one full-attention group.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockpool.core.attention import FULL_ATTENTION, AttentionKind, GroupSpec

# decimal and binary units (case-insensitive); a bare number is tokens
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)

# bytes per element of vLLM's --kv-cache-dtype (``STR_DTYPE_TO_TORCH_DTYPE``)
KV_CACHE_DTYPES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "fp8_inc": 1,
}
_MODEL_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "float": 4, "half": 2}
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


def parse_bytes(text: str) -> int | None:
    """``"8GiB"`` -> 8589934592; None when ``text`` has no byte unit (a token count)."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"not a size: {text.strip()!r} (a number with a unit: 8GiB, 500MB)")
    unit = m.group(2).lower()
    if not unit:
        return None
    if unit not in _UNITS:
        known = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
        raise ValueError(f"unknown unit {m.group(2)!r} in {text.strip()!r} (known: {known})")
    v = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(v) or v < 1:
        raise ValueError(f"a size must be positive, got {text.strip()!r}")
    return int(v)


@dataclass(frozen=True)
class KVLayout:
    """What one token costs in the pool on one GPU."""

    num_layers: int
    num_kv_heads: int  # per GPU
    head_size: int
    dtype_bytes: int
    mla: bool = False
    source: str = ""
    vectors: int = 2  # per token and head: K and V (1 under MLA, or given flat)
    # vLLM's KV-cache groups, (kind, sliding window) each; () is one
    # full-attention group (a uniform model)
    attention: tuple[tuple[AttentionKind, int | None], ...] = ()

    def group_specs(self, block_size: int) -> list[GroupSpec]:
        """The pool's KV-cache groups at ``block_size``."""
        if not self.attention:
            return [GroupSpec(FULL_ATTENTION, block_size)]
        return [GroupSpec(kind, block_size, window) for kind, window in self.attention]

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of one layer, per token (vLLM's page size / block size)."""
        return self.vectors * self.num_kv_heads * self.head_size * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.page_bytes * self.num_layers

    def num_blocks(self, budget_bytes: int, block_size: int) -> int:
        """vLLM's ``get_num_blocks``: ``budget // page_size // num_layers``."""
        return int(budget_bytes // (self.page_bytes * block_size) // self.num_layers)

    def block_bytes(self, block_size: int) -> int:
        return self.page_bytes * block_size * self.num_layers

    def to_json(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "num_kv_heads_per_gpu": self.num_kv_heads,
            "head_size": self.head_size,
            "dtype_bytes": self.dtype_bytes,
            "mla": self.mla,
            "bytes_per_token": self.bytes_per_token,
            "source": self.source,
        }


def flat_bytes(bytes_per_token: int) -> KVLayout:
    """``--bytes-per-token N``: one layer of ``N`` bytes a token."""
    if bytes_per_token < 1:
        raise ValueError(f"--bytes-per-token must be positive, got {bytes_per_token}")
    return KVLayout(1, 1, bytes_per_token, 1, source="--bytes-per-token", vectors=1)


def _int_field(cfg: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for n in names:
        v = cfg.get(n)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model config: {n} must be a positive integer, got {v!r}")
            return v
    return None


def _sliding_layers(cfg: dict[str, Any]) -> str | None:
    """Why a sliding window changes this model's pool (None: it does not)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and any("sliding" in str(t) for t in types):
        n = sum(1 for t in types if "sliding" in str(t))
        return f"{n} of {len(types)} layers use sliding-window attention (layer_types)"
    window = cfg.get("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:
        return None
    if cfg.get("sliding_window_pattern") or cfg.get("max_window_layers") is not None:
        if cfg.get("use_sliding_window", True):
            return f"sliding_window {window} on some layers (hybrid pattern)"
        return None
    return f"sliding_window {window} on every layer"


def layout_from_config(
    cfg: dict[str, Any],
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    source: str = "",
) -> KVLayout:
    """The KV layout vLLM 0.16 derives from a Hugging Face ``config.json``."""
    if tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size must be positive, got {tensor_parallel_size}")
    text = cfg.get("text_config")
    if isinstance(text, dict):
        cfg = {**text, "torch_dtype": text.get("torch_dtype") or cfg.get("torch_dtype")}
    why = _sliding_layers(cfg)
    if why is not None:
        raise ValueError(
            f"model config: {why}; vLLM then splits the pool between attention groups, which "
            "this replay does not model (give --bytes-per-token to size a full-attention pool)"
        )
    layers = _int_field(cfg, ("num_hidden_layers", "n_layer", "num_layers", "n_layers"))
    if layers is None:
        raise ValueError("model config: no num_hidden_layers")
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
        rank = _int_field(cfg, ("kv_lora_rank",))
        rope = cfg.get("qk_rope_head_dim") or 0
        assert rank is not None
        return KVLayout(
            layers, 1, rank + int(rope), dtype_bytes, mla=True, source=source, vectors=1
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
    return KVLayout(
        layers, max(1, kv // tensor_parallel_size), head_size, dtype_bytes, source=source
    )


def read_model_config(
    path: str | Path, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1
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
    return layout_from_config(cfg, kv_cache_dtype, tensor_parallel_size, source=str(p))


@dataclass(frozen=True)
class Capacity:
    """One pool size as asked (``label``) and what the pool holds."""

    label: str
    blocks: int | None  # vLLM's num_gpu_blocks (null block included); None = unbounded
    block_size: int
    block_bytes: int | None = None  # bytes of one block on one GPU (None: no layout)

    @property
    def usable_blocks(self) -> int | None:
        return None if self.blocks is None else self.blocks - 1

    @property
    def usable_tokens(self) -> int | None:
        return None if self.blocks is None else (self.blocks - 1) * self.block_size

    @property
    def capacity_tokens(self) -> int | None:
        """The token count a replay takes (``blocks * block_size``)."""
        return None if self.blocks is None else self.blocks * self.block_size

    @property
    def bytes(self) -> int | None:
        if self.blocks is None or self.block_bytes is None:
            return None
        return self.blocks * self.block_bytes


def parse_capacity_list(
    text: str, block_size: int, layout: KVLayout | None, unit: str = "tokens"
) -> list[Capacity]:
    """``"8GiB,16GiB,inf"`` (bytes need ``layout``), or tokens / blocks by ``unit``."""
    out: list[Capacity] = []
    bb = None if layout is None else layout.block_bytes(block_size)
    for part in text.split(","):
        p = part.strip()
        if not p:
            continue
        if p.lower() in ("inf", "infinity", "unbounded"):
            out.append(Capacity("inf", None, block_size, bb))
            continue
        size = parse_bytes(p)
        if size is not None:
            if layout is None:
                raise ValueError(
                    f"capacity {p!r} is in bytes: give --model-config config.json or "
                    "--bytes-per-token N"
                )
            blocks = layout.num_blocks(size, block_size)
        else:
            try:
                v = float(p)
            except ValueError:
                raise ValueError(f"not a capacity: {p!r}") from None
            if not math.isfinite(v) or v != int(v) or v < 1:
                raise ValueError(f"a capacity must be a positive integer or 'inf', got {p!r}")
            blocks = int(v) if unit == "blocks" else int(v) // block_size
        if blocks < 1:
            raise ValueError(f"capacity {p!r} holds no block of {block_size} tokens")
        out.append(Capacity(p, blocks, block_size, bb))
    if not out:
        raise ValueError("no capacity given")
    return out
