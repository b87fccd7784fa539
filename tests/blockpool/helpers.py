"""Shared by the BlockPool tests: a request with block hashes, hash keys and
their 64-bit event form, block ids and reference counts, and the types of
the pool-inspecting fixtures (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from blockpool import (
    BlockPool,
    KVCacheBlock,
    LoRARequest,
    Request,
    get_request_block_hasher,
    make_block_hash_with_group_id,
    sha256,
)

QIds = Callable[[BlockPool], list[int]]
Snap = Callable[[BlockPool], dict[str, Any]]
Mapped = Callable[[BlockPool], dict[bytes, tuple[str, list[int]]]]


def req(tokens: list[int], bs: int = 4, lora: LoRARequest | None = None) -> Request:
    hasher = get_request_block_hasher(bs, sha256)
    return Request("r", tokens, block_hasher=hasher, lora_request=lora)


def key(h: bytes, gid: int = 0) -> bytes:
    return make_block_hash_with_group_id(h, gid)  # type: ignore[arg-type]


def as_int(h: bytes) -> int:
    return int.from_bytes(h[-8:], "big")


def ids(blocks: list[KVCacheBlock] | None) -> list[int] | None:
    return None if blocks is None else [b.block_id for b in blocks]


def refs(pool: BlockPool) -> list[int]:
    return [b.ref_cnt for b in pool.blocks]
