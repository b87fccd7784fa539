"""Hash functions, NONE_HASH, chained block hashes, keys and coarse views."""

from __future__ import annotations

import hashlib
import pickle

import cbor2
import pytest
import xxhash as _xxhash

import blockpool
from blockpool import (
    BlockHash,
    BlockHashListWithBlockSize,
    PoolAssertionError,
    get_block_hash,
    get_group_id,
    get_hash_fn_by_name,
    get_none_hash,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    set_int_block_hashes,
    sha256,
    sha256_cbor,
    xxhash,
    xxhash_cbor,
)
from blockpool import hashing as hashing_module

OBJ = (b"parent", (1, 2, 3, 4), ("lora", "salt"))


def test_sha256_is_sha256_of_the_highest_protocol_pickle() -> None:
    expected = hashlib.sha256(pickle.dumps(OBJ, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert sha256(OBJ) == expected and len(expected) == 32


def test_sha256_cbor_is_canonical() -> None:
    assert sha256_cbor(OBJ) == hashlib.sha256(cbor2.dumps(OBJ, canonical=True)).digest()
    # Canonical CBOR orders map keys, so insertion order does not matter.
    assert sha256_cbor({"a": 1, "b": 2}) == sha256_cbor({"b": 2, "a": 1})


def test_xxhash_variants_are_xxh3_128() -> None:
    assert xxhash(OBJ) == _xxhash.xxh3_128_digest(
        pickle.dumps(OBJ, protocol=pickle.HIGHEST_PROTOCOL)
    )
    assert xxhash_cbor(OBJ) == _xxhash.xxh3_128_digest(cbor2.dumps(OBJ, canonical=True))
    assert len(xxhash(OBJ)) == len(xxhash_cbor(OBJ)) == 16


def test_hash_functions_by_name() -> None:
    assert get_hash_fn_by_name("sha256") is sha256
    assert get_hash_fn_by_name("sha256_cbor") is sha256_cbor
    assert get_hash_fn_by_name("xxhash") is xxhash
    assert get_hash_fn_by_name("xxhash_cbor") is xxhash_cbor
    with pytest.raises(ValueError, match="Unsupported hash function: 'md5'"):
        get_hash_fn_by_name("md5")


@pytest.mark.usefixtures("restore_hash_settings")
def test_none_hash_from_a_seed_and_random_without() -> None:
    assert get_none_hash() == sha256("0")  # conftest fixed it
    assert init_none_hash(sha256, seed="42") == sha256("42")
    assert blockpool.NONE_HASH == hashing_module.NONE_HASH == sha256("42")
    assert init_none_hash(xxhash, seed="42") == xxhash("42")


@pytest.mark.usefixtures("restore_hash_settings")
def test_none_hash_reads_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    assert init_none_hash(sha256) == sha256("123")
    monkeypatch.delenv("PYTHONHASHSEED")
    a = init_none_hash(sha256)
    b = init_none_hash(sha256)
    assert len(a) == len(b) == 32 and a != b  # os.urandom


@pytest.mark.usefixtures("restore_hash_settings")
def test_hash_block_tokens_chains_from_none_hash() -> None:
    first = hash_block_tokens(sha256, None, [1, 2, 3, 4])
    assert first == sha256((sha256("0"), (1, 2, 3, 4), None))
    # An empty parent means "first block" too.
    assert hash_block_tokens(sha256, BlockHash(b""), [1, 2, 3, 4]) == first
    second = hash_block_tokens(sha256, first, (5, 6, 7, 8), ("lora-a",))
    assert second == sha256((first, (5, 6, 7, 8), ("lora-a",)))
    # Same tokens, different prefix: a different hash.
    assert hash_block_tokens(sha256, second, [5, 6, 7, 8]) != hash_block_tokens(
        sha256, first, [5, 6, 7, 8]
    )
    init_none_hash(sha256, seed="other")
    assert hash_block_tokens(sha256, None, [1, 2, 3, 4]) != first


def test_group_id_keys() -> None:
    h = BlockHash(bytes(range(32)))
    for gid in (0, 1, 255, 256, 70000, 2**32 - 1):
        key = make_block_hash_with_group_id(h, gid)
        assert key == h + gid.to_bytes(4, "big")
        assert get_block_hash(key) == h and get_group_id(key) == gid
    assert make_block_hash_with_group_id(h, 258)[-4:] == b"\x00\x00\x01\x02"
    with pytest.raises(OverflowError):
        make_block_hash_with_group_id(h, -1)


@pytest.mark.usefixtures("restore_hash_settings")
def test_event_hash_form() -> None:
    h = BlockHash(bytes(range(24, 56)))
    assert maybe_convert_block_hash(h) == int.from_bytes(bytes(range(48, 56)), "big")
    assert maybe_convert_block_hash(BlockHash(b"\xff" * 16)) == 2**64 - 1
    assert maybe_convert_block_hash(BlockHash(b"\x01\x02")) == 0x0102
    set_int_block_hashes(False)
    assert maybe_convert_block_hash(h) is h


def test_coarse_view_concatenates_fine_hashes() -> None:
    fine = [BlockHash(bytes([i]) * 4) for i in range(7)]
    view = BlockHashListWithBlockSize(fine, 16, 32)
    assert view.scale_factor == 2 and len(view) == 3
    assert view[0] == fine[0] + fine[1]
    assert view[2] == fine[4] + fine[5]
    assert view[1:] == [fine[2] + fine[3], fine[4] + fine[5]]
    assert view[::2] == [view[0], view[2]]
    assert list(view) == [view[0], view[1], view[2]]
    with pytest.raises(IndexError):
        view[3]
    with pytest.raises(TypeError):
        view["0"]  # type: ignore[call-overload]
    fine.append(BlockHash(b"\x07" * 4))  # the view follows the list it wraps
    assert len(view) == 4 and view[3] == fine[6] + fine[7]
    assert view[-1] == view[3] and view[-4] == view[0]
    assert len(BlockHashListWithBlockSize(fine, 4, 16)) == 2  # k = 4


def test_coarse_view_needs_a_multiple() -> None:
    with pytest.raises(PoolAssertionError):
        BlockHashListWithBlockSize([], 16, 24)
    with pytest.raises(AssertionError):  # as vLLM's assert
        BlockHashListWithBlockSize([], 16, 8)
