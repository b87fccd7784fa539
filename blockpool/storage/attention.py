"""A paged-attention reference: gather K/V through a block table, then
scaled dot-product attention in float32, causal for the prompt.

Queries sit at positions ``query_start .. query_start + Tq - 1`` (by default
the last ``Tq`` of the ``num_tokens`` tokens: the whole prompt in prefill,
the newest token in decode); each sees the keys at positions up to its own.
Grouped-query attention: ``num_heads`` must be a multiple of the KV heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from blockpool.storage._index import IndexLike
from blockpool.storage.layout import StorageError
from blockpool.storage.tensors import KVCacheStorage


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    query_start: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of ``query [Tq, heads, D]`` over contiguous
    ``key``/``value [n, kv_heads, D]``; returns ``[Tq, heads, D]`` float32."""
    if query.dim() != 3 or key.dim() != 3 or key.shape != value.shape:
        raise StorageError(
            f"query must be [Tq, heads, D] and key/value [n, kv_heads, D]; got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.device != key.device or value.device != key.device:
        raise StorageError(f"query is on {query.device}, key/value on {key.device}")
    tq, heads, size = query.shape
    n, kv_heads, kv_size = key.shape
    if size != kv_size or heads % kv_heads:
        raise StorageError(
            f"query heads {heads} x {size} do not fit kv heads {kv_heads} x {kv_size}"
        )
    start = n - tq if query_start is None else query_start
    if start < 0 or start + tq > n:
        raise StorageError(f"queries at {start}..{start + tq - 1} fall outside {n} tokens")
    group = heads // kv_heads
    q = query.to(torch.float32).transpose(0, 1)
    k = key.to(torch.float32).transpose(0, 1).repeat_interleave(group, 0)
    v = value.to(torch.float32).transpose(0, 1).repeat_interleave(group, 0)
    q_pos = torch.arange(start, start + tq, device=query.device)
    mask = torch.arange(n, device=query.device)[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


def paged_attention(
    storage: KVCacheStorage,
    layer: int,
    block_ids: IndexLike,
    num_tokens: int,
    query: torch.Tensor,
    *,
    query_start: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """``attention`` over the first ``num_tokens`` tokens' K/V of ``layer``,
    read through the block table ``block_ids``."""
    kv = storage.gather(block_ids, num_tokens, layer=layer)
    return attention(query, kv[0], kv[1], query_start=query_start, scale=scale)
