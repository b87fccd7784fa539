"""Pool sizes in memory: bytes, a model's KV layout, and vLLM's block count.

vLLM 0.16.0 sizes its pool from a byte budget per GPU in
``vllm/v1/core/kv_cache_utils.py`` (line numbers of the 0.16.0 wheel):
``get_kv_cache_config_from_groups`` (l. 1069) takes ``group_size =
max(len(group.layer_names) for group in kv_cache_groups)`` (l. 1122; a
uniform model is one group of all its layers) and calls ``get_num_blocks``
(l. 829), which computes (l. 841)::

    num_blocks = int(available_memory // page_size // group_size)

with ``page_size`` the bytes of one block of one layer
(``vllm/v1/kv_cache_interface.py``): ``AttentionSpec.real_page_size_bytes``
(l. 80) ``= 2 * block_size * num_kv_heads * head_size * dtype_size`` (K and
V; ``FullAttentionSpec``'s, l. 181, is the same with ``head_size_v =
head_size``); ``MLAAttentionSpec.real_page_size_bytes`` (l. 196) ``=
block_size * 1 * (kv_lora_rank + qk_rope_head_dim) * dtype_size`` (one
latent vector per token, no separate V).  ``num_kv_heads`` is per GPU:
``ModelConfig.get_num_kv_heads`` (``config/model.py`` l. 1146) gives
``max(1, total_kv_heads // tensor_parallel_size)``, and 1 under MLA (the
latent cache is replicated on every rank).  The dtype under ``auto`` is the
model's, a float32 checkpoint downcast to 16 bits (``_resolve_auto_dtype``,
l. 1805).  ``num_blocks`` counts the null block.  A model's layout from its
``config.json``: :mod:`blockpool.trace.sizing.model_config`.

Several groups (sliding windows): :mod:`blockpool.trace.sizing.hf_layers` derives
each layer's attention from the config as vLLM 0.16.0 builds it, and
:mod:`blockpool.trace.sizing.kv_groups` groups the layers as ``get_kv_cache_groups``
(l. 1210) does, with ``_get_kv_cache_groups_uniform_page_size``'s
``group_size`` rule (l. 1034-1042) and the hybrid manager off through
``unify_hybrid_kv_cache_specs`` (l. 1148).  A block of the shared pool is
then ``group_size`` pages (one layer of each group per tensor, padding layers
included): :meth:`KVLayout.block_bytes`; every group draws its blocks from
the same ``num_blocks``.  vLLM logs the pool as "GPU KV cache size: N tokens"
with ``N = num_blocks // len(kv_cache_groups) * min_block_size``
(``_report_kv_cache_config``, l. 1290-1294): :meth:`KVLayout.kv_cache_tokens`;
``usable_tokens`` is the same of ``num_blocks - 1`` (the null block out).
``bytes_per_token`` is what a token costs when every group holds it: ``page
/ block_size * group_size * groups``.

A capacity given in bytes is that budget per GPU (vLLM's
``--kv-cache-memory-bytes``).  With ``--bytes-per-token N`` instead of a
model, a block is ``N * block_size`` bytes (N: a token in one group,
``--kv-cache-groups`` naming the groups) and ``num_blocks = bytes // (N *
block_size)``.  A token capacity is ``num_blocks = tokens // block_size``,
times the number of groups when there are several (the inverse of vLLM's
logged figure).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from blockpool.core.attention import FULL_ATTENTION, SLIDING_WINDOW, AttentionKind, GroupSpec

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
# vLLM's --kv-cache-dtype: auto (the model's) or one of KV_CACHE_DTYPES
KVCacheDtype = Literal[
    "auto", "float32", "float", "float16", "half", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2",
    "int8", "fp8_inc",
]  # fmt: skip


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


def vllm_kv_cache_tokens(num_blocks: int, num_groups: int, min_block_size: int) -> int:
    """vLLM's logged "GPU KV cache size: N tokens" for ``num_blocks``
    (``_report_kv_cache_config``: ``num_blocks // groups * min block size``)."""
    return num_blocks // num_groups * min_block_size


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
    layers_per_group: tuple[int, ...] = ()  # one count a group; () = all layers in one
    rule: str = ""  # how each layer's attention was derived
    max_model_len: int | None = None  # vLLM's default for the config (None: no config)
    hybrid_manager: bool = True  # False: --disable-hybrid-kv-cache-manager
    sized: bool = True  # False: groups without bytes (token capacities only)

    def group_specs(self, block_size: int) -> list[GroupSpec]:
        """The pool's KV-cache groups at ``block_size``."""
        if not self.attention:
            return [GroupSpec(FULL_ATTENTION, block_size)]
        return [GroupSpec(kind, block_size, window) for kind, window in self.attention]

    @property
    def num_groups(self) -> int:
        return max(1, len(self.attention))

    @property
    def group_size(self) -> int:
        """Layers in a group, padding included (vLLM's ``group_size``)."""
        return max(self.layers_per_group) if self.layers_per_group else self.num_layers

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of one layer, per token (vLLM's page size / block size)."""
        return self.vectors * self.num_kv_heads * self.head_size * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """A token held by every group: one page share per layer of each group."""
        return self.page_bytes * self.group_size * self.num_groups

    def num_blocks(self, budget_bytes: int, block_size: int) -> int:
        """vLLM's ``get_num_blocks``: ``budget // page_size // group_size``."""
        if not self.sized:
            raise ValueError(
                "a capacity in bytes needs --model-config config.json or --bytes-per-token N"
            )
        return int(budget_bytes // (self.page_bytes * block_size) // self.group_size)

    def block_bytes(self, block_size: int) -> int:
        """One block of the shared pool: a page in each of ``group_size`` tensors."""
        return self.page_bytes * block_size * self.group_size

    def kv_cache_tokens(self, num_blocks: int, block_size: int) -> int:
        """vLLM's "GPU KV cache size: N tokens" (``_report_kv_cache_config``)."""
        return vllm_kv_cache_tokens(num_blocks, self.num_groups, block_size)

    def to_json(self) -> dict[str, Any]:
        counts = self.layers_per_group or (self.num_layers,)
        groups = self.attention or ((FULL_ATTENTION, None),)
        return {
            "num_layers": self.num_layers,
            "num_kv_heads_per_gpu": self.num_kv_heads,
            "head_size": self.head_size,
            "dtype_bytes": self.dtype_bytes,
            "mla": self.mla,
            "bytes_per_token": self.bytes_per_token if self.sized else None,
            "source": self.source,
            "kv_cache_groups": [
                {"attention": kind, "sliding_window": window, "layers": n}
                for (kind, window), n in zip(groups, counts, strict=True)
            ],
            "num_groups": self.num_groups,
            "group_size": self.group_size,
            "layer_rule": self.rule,
            "hybrid_kv_cache_manager": self.hybrid_manager,
            "max_model_len": self.max_model_len,
        }


def block_bytes_of(layout: KVLayout | None, block_size: int) -> int | None:
    """Bytes of one block, None without a layout that has bytes."""
    if layout is None or not layout.sized:
        return None
    return layout.block_bytes(block_size)


_GROUP = re.compile(r"^(full|sliding:([0-9]+))(?:x([0-9]+))?$")


def parse_kv_cache_groups(text: str) -> tuple[tuple[AttentionKind, int | None], ...]:
    """``--kv-cache-groups full,sliding:4096x5``: each group's attention, in order.

    ``full`` is a full-attention group, ``sliding:W`` one with a window of W
    tokens; ``xN`` repeats it N times.  One full group alone is ``()``.
    """
    out: list[tuple[AttentionKind, int | None]] = []
    for part in text.split(","):
        p = part.strip().lower()
        m = _GROUP.match(p)
        if m is None:
            raise ValueError(
                f"--kv-cache-groups: {part.strip()!r} is not a group (full, sliding:WINDOW, "
                "either with xCOUNT: full,sliding:4096x3)"
            )
        window = None if m.group(2) is None else int(m.group(2))
        count = 1 if m.group(3) is None else int(m.group(3))
        if window == 0 or count < 1 or count > 1024:
            raise ValueError(f"--kv-cache-groups: {part.strip()!r}: a window and a count are 1+")
        kind: AttentionKind = FULL_ATTENTION if window is None else SLIDING_WINDOW
        out += [(kind, window)] * count
    if len(out) > 1024:
        raise ValueError("--kv-cache-groups: more than 1024 groups")
    return () if out == [(FULL_ATTENTION, None)] else tuple(out)


def flat_bytes(
    bytes_per_token: int, attention: tuple[tuple[AttentionKind, int | None], ...] = ()
) -> KVLayout:
    """``--bytes-per-token N``: ``N`` bytes a token in each group (``--kv-cache-groups``)."""
    if bytes_per_token < 1:
        raise ValueError(f"--bytes-per-token must be positive, got {bytes_per_token}")
    counts = (1,) * len(attention) if attention else ()
    return KVLayout(
        1, 1, bytes_per_token, 1, source="--bytes-per-token", vectors=1, attention=attention,
        layers_per_group=counts,
    )  # fmt: skip


def groups_only(attention: tuple[tuple[AttentionKind, int | None], ...]) -> KVLayout:
    """``--kv-cache-groups`` alone: the groups, no bytes (token capacities only)."""
    counts = (1,) * len(attention) if attention else ()
    return KVLayout(
        1, 1, 0, 1, source="--kv-cache-groups", vectors=1, attention=attention,
        layers_per_group=counts, sized=False,
    )  # fmt: skip


@dataclass(frozen=True)
class Capacity:
    """One pool size as asked (``label``) and what the pool holds."""

    label: str
    blocks: int | None  # vLLM's num_gpu_blocks (null block included); None = unbounded
    block_size: int
    block_bytes: int | None = None  # bytes of one block on one GPU (None: no layout)
    groups: int = 1  # KV-cache groups sharing the blocks

    @property
    def usable_blocks(self) -> int | None:
        return None if self.blocks is None else self.blocks - 1

    @property
    def usable_tokens(self) -> int | None:
        """Tokens every group can hold at once (the null block left out)."""
        if self.blocks is None:
            return None
        return (self.blocks - 1) // self.groups * self.block_size

    @property
    def kv_cache_tokens(self) -> int | None:
        """vLLM's logged "GPU KV cache size" (``num_blocks // groups * block_size``)."""
        return (
            None
            if self.blocks is None
            else vllm_kv_cache_tokens(self.blocks, self.groups, self.block_size)
        )

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
    bb = block_bytes_of(layout, block_size)
    groups = 1 if layout is None else layout.num_groups
    for part in text.split(","):
        p = part.strip()
        if not p:
            continue
        if p.lower() in ("inf", "infinity", "unbounded"):
            out.append(Capacity("inf", None, block_size, bb, groups))
            continue
        size = parse_bytes(p)
        if size is not None:
            if layout is None or not layout.sized:
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
            blocks = int(v) if unit == "blocks" else int(v) // block_size * groups
        if blocks < 1:
            raise ValueError(f"capacity {p!r} holds no block of {block_size} tokens")
        out.append(Capacity(p, blocks, block_size, bb, groups))
    if not out:
        raise ValueError("no capacity given")
    return out
