"""Request and the request block hasher (extra keys: LoRA, multimodal, salt)."""

from __future__ import annotations

import pytest

from blockpool import (
    LoRARequest,
    MultiModalFeature,
    PlaceholderRange,
    Request,
    generate_block_hash_extra_keys,
    get_none_hash,
    get_request_block_hasher,
    hash_block_tokens,
    sha256,
    xxhash,
)
from blockpool.core.block_hasher import need_extra_keys


def chain(tokens: list[int], bs: int, keys: list[tuple[object, ...] | None]) -> list[bytes]:
    """The expected chained hashes, written out."""
    out: list[bytes] = []
    parent = get_none_hash()
    for i, k in enumerate(keys):
        parent = hash_block_tokens(sha256, parent, tokens[i * bs : (i + 1) * bs], k)
        out.append(parent)
    return out


def mm(ident: str, offset: int, length: int) -> MultiModalFeature:
    return MultiModalFeature(ident, PlaceholderRange(offset, length))


def test_request_fields() -> None:
    r = Request("r1", iter([5, 6, 7]))
    assert (r.request_id, r.prompt_token_ids, r.all_token_ids) == ("r1", [5, 6, 7], [5, 6, 7])
    assert (r.num_tokens, r.num_prompt_tokens, r.num_output_tokens) == (3, 3, 0)
    assert r.block_hashes == [] and r.lora_request is None and r.cache_salt is None
    assert r.mm_features == [] and r.prompt_embeds is None
    r.append_output_token_ids(8)
    r.append_output_token_ids([9, 10])
    assert r.all_token_ids == [5, 6, 7, 8, 9, 10] and r.prompt_token_ids == [5, 6, 7]
    assert (r.num_tokens, r.num_output_tokens) == (6, 3)
    assert r.block_hashes == []  # no hasher, no hashes


def test_lora_request_names() -> None:
    lora = LoRARequest("sql", 3)
    assert (lora.name, lora.adapter_id, lora.lora_name, lora.lora_int_id) == ("sql", 3, "sql", 3)
    assert LoRARequest("x").adapter_id == 1


def test_full_blocks_only_and_incremental() -> None:
    hasher = get_request_block_hasher(4, sha256)
    toks = list(range(11))
    r = Request("r", toks, block_hasher=hasher)
    assert r.block_hashes == chain(toks, 4, [None, None])
    first = list(r.block_hashes)
    r.append_output_token_ids(11)  # 12 tokens: the third block fills
    assert r.block_hashes[:2] == first
    assert r.block_hashes == chain([*toks, 11], 4, [None] * 3)
    r.append_output_token_ids([12, 13])
    assert len(r.block_hashes) == 3
    assert hasher(r) == []  # nothing new to hash
    whole = Request("w", list(range(14)), block_hasher=hasher)
    assert whole.block_hashes == r.block_hashes


def test_short_requests_have_no_hashes() -> None:
    r = Request("r", [1, 2, 3], block_hasher=get_request_block_hasher(4, sha256))
    assert r.block_hashes == []


def test_other_hash_function() -> None:
    r = Request("r", [1, 2, 3, 4], block_hasher=get_request_block_hasher(4, xxhash))
    assert r.block_hashes == [xxhash((get_none_hash(), (1, 2, 3, 4), None))]
    assert len(r.block_hashes[0]) == 16


def test_lora_name_in_every_block_salt_in_the_first() -> None:
    hasher = get_request_block_hasher(2, sha256)
    toks = [1, 2, 3, 4, 5, 6]
    r = Request("r", toks, block_hasher=hasher, lora_request=LoRARequest("a"), cache_salt="s")
    assert r.block_hashes == chain(toks, 2, [("a", "s"), ("a",), ("a",)])
    salt = Request("r", toks, block_hasher=hasher, cache_salt="s")
    assert salt.block_hashes == chain(toks, 2, [("s",), None, None])
    plain = Request("r", toks, block_hasher=hasher)
    assert len({r.block_hashes[2], salt.block_hashes[2], plain.block_hashes[2]}) == 3
    # An empty salt is "present" for need_extra_keys but adds no key.
    empty = Request("r", toks, block_hasher=hasher, cache_salt="")
    assert need_extra_keys(empty) and empty.block_hashes == plain.block_hashes


def test_multimodal_keys_follow_the_placeholders() -> None:
    hasher = get_request_block_hasher(4, sha256)
    toks = list(range(16))
    feats = [mm("img0", 2, 5), mm("img1", 9, 2)]  # tokens 2..6 and 9..10
    r = Request("r", toks, block_hasher=hasher, mm_features=feats, lora_request=LoRARequest("L"))
    assert r.block_hashes == chain(toks, 4, [("L", "img0"), ("L", "img0"), ("L", "img1"), ("L",)])


def test_one_block_holding_two_inputs() -> None:
    feats = [mm("a", 1, 1), mm("b", 2, 1), mm("c", 6, 1)]
    r = Request("r", list(range(8)), mm_features=feats)
    assert generate_block_hash_extra_keys(r, 0, 4, 0) == (("a", "b"), 2)
    assert generate_block_hash_extra_keys(r, 4, 8, 2) == (("c",), 3)
    assert generate_block_hash_extra_keys(r, 8, 12, 3) == (None, 3)


def test_decode_block_after_an_input_ending_on_the_boundary() -> None:
    # As vLLM: a block hashed later starts from the last input and includes
    # it when the block starts exactly where the input ends.
    hasher = get_request_block_hasher(4, sha256)
    r = Request("r", [0, 1, 2, 3, 4], block_hasher=hasher, mm_features=[mm("img", 0, 4)])
    assert r.block_hashes == chain([0, 1, 2, 3], 4, [("img",)])
    r.append_output_token_ids([5, 6, 7])
    assert r.block_hashes == chain(list(range(8)), 4, [("img",), ("img",)])
    r.append_output_token_ids([8, 9, 10, 11])
    assert r.block_hashes == chain(list(range(12)), 4, [("img",), ("img",), None])
    # All at once the same prompt gives the second block no key.
    whole = Request("w", list(range(8)), block_hasher=hasher, mm_features=[mm("img", 0, 4)])
    assert whole.block_hashes == chain(list(range(8)), 4, [("img",), None])


def test_extra_keys_without_anything() -> None:
    r = Request("r", [1, 2, 3, 4])
    assert not need_extra_keys(r)
    assert generate_block_hash_extra_keys(r, 0, 4, 0) == (None, 0)
    assert need_extra_keys(Request("r", [1], lora_request=LoRARequest("x")))
    assert need_extra_keys(Request("r", [1], mm_features=[mm("i", 0, 1)]))


@pytest.mark.parametrize("bs", [1, 3, 16])
def test_hash_count_is_full_blocks(bs: int) -> None:
    for n in range(0, 40, 7):
        r = Request("r", list(range(n)), block_hasher=get_request_block_hasher(bs, sha256))
        assert len(r.block_hashes) == n // bs
