"""Hashes of a request's full blocks, with vLLM's extra keys.

Extra keys, in vLLM's order: the LoRA name, the identifiers of multimodal
inputs overlapping the block, the cache salt (first block only), the raw
bytes of the block's rows of the prompt embeddings (when the request has
them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

from blockpool.core.hashing import BlockHash, HashFn, hash_block_tokens


class HashableRequest(Protocol):
    all_token_ids: list[int]
    block_hashes: list[BlockHash]
    lora_request: Any
    cache_salt: str | None
    mm_features: list[Any]
    prompt_embeds: Any

    @property
    def num_tokens(self) -> int: ...


def need_extra_keys(request: HashableRequest) -> bool:
    """Whether the request has multimodal inputs, a LoRA adapter or a cache
    salt (as vLLM 0.16.0's: prompt embeddings are not counted here, though
    they still enter the keys)."""
    return (
        bool(request.mm_features)
        or request.lora_request is not None
        or (request.cache_salt is not None)
    )


def _mm_extra_keys(
    request: HashableRequest, start: int, end: int, mm_idx: int
) -> tuple[list[Any], int]:
    feats = request.mm_features
    keys: list[Any] = []
    if not feats:
        return keys, mm_idx
    last = feats[-1].mm_position
    if last.offset + last.length < start:
        return keys, mm_idx
    if mm_idx < 0:
        mm_idx += len(feats)
    while mm_idx < len(feats):
        feat = feats[mm_idx]
        offset, length = feat.mm_position.offset, feat.mm_position.length
        if end <= offset:
            break  # the block ends before this input starts
        if start > offset + length:
            mm_idx += 1  # the block starts after this input
            continue
        keys.append(feat.identifier)
        if end >= offset + length:
            mm_idx += 1  # the input ends in this block; the next may start here
        else:
            break
    return keys, mm_idx


def embeds_bytes(embeds: Any) -> bytes:
    """The raw bytes of an embeddings tensor (row-major, native byte order),
    what vLLM 0.16.0 puts in a block's extra keys.  Accepts a torch tensor,
    a numpy array, or anything exposing the buffer protocol."""
    torch = sys.modules.get("torch")  # a tensor means torch is loaded; never import it
    if torch is not None and isinstance(embeds, torch.Tensor):
        flat = embeds.flatten().contiguous()
        return bytes(flat.view(torch.uint8).numpy().tobytes())
    if hasattr(embeds, "tobytes"):
        return bytes(embeds.tobytes())
    return bytes(memoryview(embeds))


def generate_block_hash_extra_keys(
    request: HashableRequest, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """(extra keys or None, next multimodal index) for one block."""
    mm_keys, next_mm = _mm_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    keys: list[Any] = []
    if request.lora_request:
        keys.append(request.lora_request.lora_name)
    keys.extend(mm_keys)
    if start_token_idx == 0 and request.cache_salt:
        keys.append(request.cache_salt)
    embeds = request.prompt_embeds
    if embeds is not None:
        keys.append(embeds_bytes(embeds[start_token_idx:end_token_idx]))
    return (tuple(keys) if keys else None), next_mm


def get_request_block_hasher(
    block_size: int, caching_hash_fn: HashFn
) -> Callable[[HashableRequest], list[BlockHash]]:
    """A function giving the hashes of a request's full blocks not yet in
    ``request.block_hashes`` (a partial tail block gets none)."""

    def request_block_hasher(request: HashableRequest) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        if start + block_size > num_tokens:
            return []
        mm_idx = -1 if start > 0 else 0
        parent = request.block_hashes[-1] if request.block_hashes else None
        tokens = request.all_token_ids
        extra = need_extra_keys(request) or request.prompt_embeds is not None
        out: list[BlockHash] = []
        while start + block_size <= num_tokens:
            end = start + block_size
            keys = None
            if extra:
                keys, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
            parent = hash_block_tokens(caching_hash_fn, parent, tokens[start:end], keys)
            out.append(parent)
            start = end
        return out

    return request_block_hasher
