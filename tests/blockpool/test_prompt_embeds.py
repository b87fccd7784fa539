"""Prompt embeddings in the block hashes (vLLM 0.16.0's extra keys).

Each full block's extra keys end with the raw bytes of that block's rows of
the embeddings tensor; ``need_extra_keys`` does not count embeddings (as in
0.16.0), yet the hasher still includes them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import blockpool as bp
from blockpool.core.block_hasher import embeds_bytes


def rows_bytes(t: torch.Tensor, start: int, end: int) -> bytes:
    """The expected key, computed independently: row-major native bytes."""
    return t[start:end].detach().contiguous().numpy().tobytes()


def test_embeds_enter_every_block_and_only_full_ones() -> None:
    emb = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)
    hasher = bp.get_request_block_hasher(4, bp.sha256)
    r = bp.Request("r", None, prompt_embeds=emb, block_hasher=hasher)
    assert r.all_token_ids == [0] * 10 and r.num_prompt_tokens == 10
    assert not bp.need_extra_keys(r)  # 0.16.0 does not count embeddings here
    parent = bp.get_none_hash()
    expected = []
    for i in range(2):  # 10 tokens: two full blocks
        key = (rows_bytes(emb, 4 * i, 4 * i + 4),)
        parent = bp.hash_block_tokens(bp.sha256, parent, [0] * 4, key)
        expected.append(parent)
    assert r.block_hashes == expected
    plain = bp.Request("p", [0] * 10, block_hasher=hasher)
    assert plain.block_hashes[0] != r.block_hashes[0]


def test_different_embeds_give_different_hashes_equal_give_equal() -> None:
    hasher = bp.get_request_block_hasher(2, bp.sha256)
    a = torch.ones(4, 2, dtype=torch.float16)
    b = a.clone()
    b[3, 1] = 2.0  # only the second block differs
    ra = bp.Request("a", [7, 8, 9, 10], prompt_embeds=a, block_hasher=hasher)
    rb = bp.Request("b", [7, 8, 9, 10], prompt_embeds=b, block_hasher=hasher)
    rc = bp.Request("c", [7, 8, 9, 10], prompt_embeds=a.clone(), block_hasher=hasher)
    assert ra.block_hashes[0] == rb.block_hashes[0]
    assert ra.block_hashes[1] != rb.block_hashes[1]
    assert ra.block_hashes == rc.block_hashes


def test_embeds_key_comes_after_lora_mm_and_salt() -> None:
    emb = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    feats = [bp.MultiModalFeature("img", bp.PlaceholderRange(1, 2))]
    r = bp.Request(
        "r", list(range(8)), prompt_embeds=emb, lora_request=bp.LoRARequest("L"),
        cache_salt="s", mm_features=feats,
    )  # fmt: skip
    keys, nxt = bp.generate_block_hash_extra_keys(r, 0, 4, 0)
    assert keys == ("L", "img", "s", rows_bytes(emb, 0, 4)) and nxt == 1
    keys, _ = bp.generate_block_hash_extra_keys(r, 4, 8, nxt)
    assert keys == ("L", rows_bytes(emb, 4, 8))


def test_decode_blocks_hash_the_placeholder_tokens_only() -> None:
    # Output tokens have no embedding rows: the slice past the prompt is
    # empty, and an empty tensor's bytes (b"") are still a key.
    emb = torch.zeros(4, 2)
    hasher = bp.get_request_block_hasher(4, bp.sha256)
    r = bp.Request("r", None, prompt_embeds=emb, block_hasher=hasher)
    r.append_output_token_ids([5, 6, 7, 8])
    key = (b"",)
    assert r.block_hashes[1] == bp.hash_block_tokens(
        bp.sha256, r.block_hashes[0], [5, 6, 7, 8], key
    )


def test_bfloat16_and_non_contiguous_and_numpy() -> None:
    bf = torch.tensor([[1.5, -2.0], [3.0, 0.25]], dtype=torch.bfloat16)
    assert embeds_bytes(bf) == bf.view(torch.int16).numpy().tobytes()
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # non-contiguous
    assert embeds_bytes(t) == t.contiguous().numpy().tobytes()
    arr = np.arange(6, dtype=np.float32)
    assert embeds_bytes(arr) == arr.tobytes()


def test_bad_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        bp.Request("r", [1, 2, 3], prompt_embeds=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="prompt_token_ids or prompt_embeds"):
        bp.Request("r", None)
