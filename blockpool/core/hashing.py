"""Block hashing: hash functions, chained block hashes, group-id keys.

A block's hash stands for its whole prefix: it hashes the parent block's hash
together with the block's token ids and any extra keys (LoRA name, cache salt,
multimodal identifiers).  Keys in the pool's hash map are the block hash with
the KV-cache group id appended as 4 big-endian bytes.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, NewType, TypeAlias, overload

import cbor2

from blockpool.core.errors import PoolAssertionError

BlockHash = NewType("BlockHash", bytes)
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)
# What events carry: an int (default) or the raw digest.
ExternalBlockHash: TypeAlias = bytes | int
HashFn: TypeAlias = Callable[[Any], bytes]

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL
_MASK64 = (1 << 64) - 1


def sha256(input: Any) -> bytes:  # noqa: A002 - vLLM's parameter name
    """SHA-256 (32 bytes) of the object's highest-protocol pickle."""
    return hashlib.sha256(pickle.dumps(input, protocol=_PICKLE_PROTOCOL)).digest()


def sha256_cbor(input: Any) -> bytes:  # noqa: A002
    """SHA-256 of the object's canonical CBOR encoding (language independent)."""
    return hashlib.sha256(cbor2.dumps(input, canonical=True)).digest()


def _xxh3_128(data: bytes) -> bytes:
    try:
        import xxhash as _xxhash
    except ImportError:  # pragma: no cover - xxhash is a declared dependency
        raise ModuleNotFoundError(
            "xxhash is required for the 'xxhash' hash functions: pip install xxhash"
        ) from None
    return _xxhash.xxh3_128_digest(data)


def xxhash(input: Any) -> bytes:  # noqa: A002
    """xxh3-128 (16 bytes) of the object's highest-protocol pickle."""
    return _xxh3_128(pickle.dumps(input, protocol=_PICKLE_PROTOCOL))


def xxhash_cbor(input: Any) -> bytes:  # noqa: A002
    """xxh3-128 of the object's canonical CBOR encoding."""
    return _xxh3_128(cbor2.dumps(input, canonical=True))


# The hash functions' names (the keys of HASH_FUNCTIONS, sorted).
HashName = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]

HASH_FUNCTIONS: dict[str, HashFn] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
}


def get_hash_fn_by_name(hash_fn_name: str) -> HashFn:
    """The hash function called ``hash_fn_name``; ValueError for an unknown name."""
    try:
        return HASH_FUNCTIONS[hash_fn_name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(HASH_FUNCTIONS))
        raise ValueError(f"Unsupported hash function: {hash_fn_name!r} (known: {known})") from None


# --- NONE_HASH: the parent of every first block ---------------------------

_none_hash: BlockHash = BlockHash(b"")


def init_none_hash(hash_fn: HashFn, seed: str | None = None) -> BlockHash:
    """Set NONE_HASH as vLLM does: ``hash_fn(seed)`` when a seed is given or
    PYTHONHASHSEED is set, 32 random bytes otherwise.  Returns the new value."""
    global _none_hash
    if seed is None:
        seed = os.environ.get("PYTHONHASHSEED")
    if seed is None:
        _none_hash = BlockHash(os.urandom(32))
    else:
        _none_hash = BlockHash(hash_fn(seed))
    return _none_hash


def get_none_hash() -> BlockHash:
    """The current NONE_HASH (also readable as ``blockpool.NONE_HASH``)."""
    return _none_hash


def __getattr__(name: str) -> Any:
    # NONE_HASH is reassigned by init_none_hash; a module attribute lookup
    # always gives the current value.
    if name == "NONE_HASH":
        return _none_hash
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


init_none_hash(sha256)


# --- chained block hashes -------------------------------------------------


def hash_block_tokens(
    hash_function: HashFn,
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    """``hash_function((parent or NONE_HASH, tuple(token_ids), extra_keys))``."""
    if not parent_block_hash:
        parent_block_hash = _none_hash
    return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys)))


_GID_SUFFIX = [i.to_bytes(4, "big") for i in range(256)]


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """The hash followed by ``group_id`` as 4 big-endian unsigned bytes."""
    if 0 <= group_id < 256:
        return BlockHashWithGroupId(block_hash + _GID_SUFFIX[group_id])
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big", signed=False))


def group_id_suffix(group_id: int) -> bytes:
    """The 4 bytes ``make_block_hash_with_group_id`` appends for ``group_id``."""
    if 0 <= group_id < 256:
        return _GID_SUFFIX[group_id]
    return group_id.to_bytes(4, "big", signed=False)


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    """All but the last 4 bytes of a key."""
    return BlockHash(key[:-4])


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The group id held in a key's last 4 bytes."""
    return int.from_bytes(key[-4:], "big", signed=False)


# --- hashes as events show them --------------------------------------------

_use_int_block_hashes = True


def set_int_block_hashes(enabled: bool) -> None:
    """Events show hashes as 64-bit ints (vLLM's default) or as raw bytes."""
    global _use_int_block_hashes
    _use_int_block_hashes = bool(enabled)


def int_block_hashes() -> bool:
    """Whether events show hashes as ints (see set_int_block_hashes)."""
    return _use_int_block_hashes


def maybe_convert_block_hash(hash_bytes: BlockHash) -> ExternalBlockHash:
    """The digest's last 8 bytes as a big-endian int, or the bytes themselves."""
    if not _use_int_block_hashes:
        return hash_bytes
    return int.from_bytes(hash_bytes[-8:], "big") & _MASK64


# --- coarse blocks ---------------------------------------------------------


class BlockHashListWithBlockSize:
    """A lazy view of fine block hashes at a coarser block size.

    With ``target_block_size == k * hash_block_size`` item ``i`` is the
    concatenation of fine hashes ``i*k .. i*k+k-1``; the length is
    ``len(fine) // k``.  It follows the list it wraps as that list grows.
    """

    __slots__ = ("block_hashes", "scale_factor")

    def __init__(
        self, block_hashes: list[BlockHash], hash_block_size: int, target_block_size: int
    ) -> None:
        if hash_block_size <= 0 or target_block_size % hash_block_size:
            raise PoolAssertionError(
                f"target block size {target_block_size} is not a multiple of "
                f"hash block size {hash_block_size}"
            )
        self.block_hashes = block_hashes
        self.scale_factor = target_block_size // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    @overload
    def __getitem__(self, idx: int) -> BlockHash: ...

    @overload
    def __getitem__(self, idx: slice) -> list[BlockHash]: ...

    def __getitem__(self, idx: int | slice) -> BlockHash | list[BlockHash]:
        if isinstance(idx, int):
            n = len(self)
            if idx < 0:
                idx += n
            if not 0 <= idx < n:
                raise IndexError("coarse block hash index out of range")
            return self._at(idx)
        if isinstance(idx, slice):
            return [self._at(i) for i in range(*idx.indices(len(self)))]
        raise TypeError(f"Invalid index type: {type(idx)!r}")

    def __iter__(self) -> Iterator[BlockHash]:
        for i in range(len(self)):
            yield self._at(i)

    def _at(self, idx: int) -> BlockHash:
        k = self.scale_factor
        return BlockHash(b"".join(self.block_hashes[idx * k : idx * k + k]))


BlockHashList: TypeAlias = list[BlockHash] | BlockHashListWithBlockSize
