"""Hash functions, NONE_HASH, chained block hashes, keys and coarse views."""

from __future__ import annotations

import hashlib
import pickle

import cbor2
import pytest
import xxhash as _xxhash

import blockpool
from blockpool.core import hashing

OBJ = (b"parent", (1, 2, 3, 4), ("lora", "salt"))


def test_sha256_is_sha256_of_the_highest_protocol_pickle() -> None:
    expected = hashlib.sha256(pickle.dumps(OBJ, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert hashing.sha256(OBJ) == expected and len(expected) == 32


def test_sha256_cbor_is_canonical() -> None:
    assert hashing.sha256_cbor(OBJ) == hashlib.sha256(cbor2.dumps(OBJ, canonical=True)).digest()
    # Canonical CBOR orders map keys, so insertion order does not matter.
    assert hashing.sha256_cbor({"a": 1, "b": 2}) == hashing.sha256_cbor({"b": 2, "a": 1})


def test_xxhash_variants_are_xxh3_128() -> None:
    assert hashing.xxhash(OBJ) == _xxhash.xxh3_128_digest(
        pickle.dumps(OBJ, protocol=pickle.HIGHEST_PROTOCOL)
    )
    assert hashing.xxhash_cbor(OBJ) == _xxhash.xxh3_128_digest(cbor2.dumps(OBJ, canonical=True))
    assert len(hashing.xxhash(OBJ)) == len(hashing.xxhash_cbor(OBJ)) == 16


def test_hash_functions_by_name() -> None:
    assert hashing.get_hash_fn_by_name("sha256") is hashing.sha256
    assert hashing.get_hash_fn_by_name("sha256_cbor") is hashing.sha256_cbor
    assert hashing.get_hash_fn_by_name("xxhash") is hashing.xxhash
    assert hashing.get_hash_fn_by_name("xxhash_cbor") is hashing.xxhash_cbor
    with pytest.raises(ValueError, match="Unsupported hash function: 'md5'"):
        hashing.get_hash_fn_by_name("md5")


@pytest.mark.usefixtures("restore_hash_settings")
def test_none_hash_from_a_seed_and_random_without() -> None:
    assert hashing.get_none_hash() == hashing.sha256("0")  # conftest fixed it
    assert hashing.init_none_hash(hashing.sha256, seed="42") == hashing.sha256("42")
    assert blockpool.NONE_HASH == hashing.NONE_HASH == hashing.sha256("42")
    assert hashing.init_none_hash(hashing.xxhash, seed="42") == hashing.xxhash("42")


@pytest.mark.usefixtures("restore_hash_settings")
def test_none_hash_reads_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    assert hashing.init_none_hash(hashing.sha256) == hashing.sha256("123")
    monkeypatch.delenv("PYTHONHASHSEED")
    a = hashing.init_none_hash(hashing.sha256)
    b = hashing.init_none_hash(hashing.sha256)
    assert len(a) == len(b) == 32 and a != b  # os.urandom


@pytest.mark.usefixtures("restore_hash_settings")
def test_hash_block_tokens_chains_from_none_hash() -> None:
    first = hashing.hash_block_tokens(hashing.sha256, None, [1, 2, 3, 4])
    assert first == hashing.sha256((hashing.sha256("0"), (1, 2, 3, 4), None))
    # An empty parent means "first block" too.
    assert hashing.hash_block_tokens(hashing.sha256, hashing.BlockHash(b""), [1, 2, 3, 4]) == first
    second = hashing.hash_block_tokens(hashing.sha256, first, (5, 6, 7, 8), ("lora-a",))
    assert second == hashing.sha256((first, (5, 6, 7, 8), ("lora-a",)))
    # Same tokens, different prefix: a different hash.
    assert hashing.hash_block_tokens(
        hashing.sha256, second, [5, 6, 7, 8]
    ) != hashing.hash_block_tokens(hashing.sha256, first, [5, 6, 7, 8])
    hashing.init_none_hash(hashing.sha256, seed="other")
    assert hashing.hash_block_tokens(hashing.sha256, None, [1, 2, 3, 4]) != first


def test_group_id_keys() -> None:
    h = hashing.BlockHash(bytes(range(32)))
    for gid in (0, 1, 255, 256, 70000, 2**32 - 1):
        key = hashing.make_block_hash_with_group_id(h, gid)
        assert key == h + gid.to_bytes(4, "big")
        assert hashing.get_block_hash(key) == h and hashing.get_group_id(key) == gid
    assert hashing.make_block_hash_with_group_id(h, 258)[-4:] == b"\x00\x00\x01\x02"
    with pytest.raises(OverflowError):
        hashing.make_block_hash_with_group_id(h, -1)


@pytest.mark.usefixtures("restore_hash_settings")
def test_event_hash_form() -> None:
    h = hashing.BlockHash(bytes(range(24, 56)))
    assert hashing.maybe_convert_block_hash(h) == int.from_bytes(bytes(range(48, 56)), "big")
    assert hashing.maybe_convert_block_hash(hashing.BlockHash(b"\xff" * 16)) == 2**64 - 1
    assert hashing.maybe_convert_block_hash(hashing.BlockHash(b"\x01\x02")) == 0x0102
    hashing.set_int_block_hashes(False)
    assert hashing.maybe_convert_block_hash(h) is h


def test_coarse_view_concatenates_fine_hashes() -> None:
    fine = [hashing.BlockHash(bytes([i]) * 4) for i in range(7)]
    view = hashing.BlockHashListWithBlockSize(fine, 16, 32)
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
    fine.append(hashing.BlockHash(b"\x07" * 4))  # the view follows the list it wraps
    assert len(view) == 4 and view[3] == fine[6] + fine[7]
    assert view[-1] == view[3] and view[-4] == view[0]
    assert len(hashing.BlockHashListWithBlockSize(fine, 4, 16)) == 2  # k = 4


def test_coarse_view_needs_a_multiple() -> None:
    with pytest.raises(hashing.PoolAssertionError):
        hashing.BlockHashListWithBlockSize([], 16, 24)
    with pytest.raises(AssertionError):  # as vLLM's assert
        hashing.BlockHashListWithBlockSize([], 16, 8)
