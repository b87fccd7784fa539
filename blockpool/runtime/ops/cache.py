"""Make held blocks reachable by hash: the record, its handler and its declaration."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated, Any, Literal, cast

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.core.hashing import BlockHash, hash_block_tokens
from blockpool.core.request import LoRARequest
from blockpool.runtime.errors import Conflict, InvalidInput
from blockpool.runtime.observer import Change, ChangeKind
from blockpool.runtime.ops.base import (
    OpRecord,
    OpSpec,
    Outcome,
    RuntimeState,
    blocks_of,
    check_ids,
    check_tokens,
)
from blockpool.runtime.ops.fields import BlockId, ExtraKey, GroupId, HexHash, RawHash, TokenId


@shape
class Cached(TypedDict):
    """The blocks now cached and their hashes (hex digests)."""

    block_ids: list[int]
    block_hashes: list[str]


class CacheOp(OpRecord[Cached], kw_only=True):
    """cache_full_blocks: make held blocks reachable by hash.

    Give ``token_ids`` (block_size per block; hashes are chained from
    ``parent_block_hash``, with ``lora_name`` / ``cache_salt`` as extra keys)
    or precomputed ``block_hashes`` (one per block)."""

    op: Literal["cache"] = "cache"
    block_ids: Annotated[list[BlockId], msgspec.Meta(min_length=1, examples=[[1, 2]])]
    token_ids: list[TokenId] | None = None
    block_hashes: list[HexHash] | None = None
    parent_block_hash: HexHash | None = None
    group_id: GroupId = 0
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


def _chain(rt: RuntimeState, op: CacheOp, parent: BlockHash | None, n: int) -> list[BlockHash]:
    bs = rt.config.block_size
    tokens = op.token_ids or []
    if len(tokens) != n * bs:
        raise InvalidInput(
            f"cache: {n} block(s) of {bs} tokens need {n * bs} token ids, got {len(tokens)}",
            expected=n * bs,
            given=len(tokens),
        )
    hashes: list[BlockHash] = []
    for i in range(n):
        keys: list[Any] = []
        if op.lora_name:
            keys.append(op.lora_name)
        if i == 0 and parent is None and op.cache_salt:
            keys.append(op.cache_salt)
        parent = hash_block_tokens(
            rt.hash_fn, parent, tokens[i * bs : (i + 1) * bs], tuple(keys) if keys else None
        )
        hashes.append(parent)
    return hashes


def _check_blocks(rt: RuntimeState, ids: list[int]) -> None:
    """The blocks a cache operation names can take a hash (either record)."""
    check_ids(rt, ids, "cache")
    if len(set(ids)) != len(ids):
        raise InvalidInput("cache: block ids must be distinct", block_ids=ids[:50])
    for bid in ids:
        block = rt.pool.blocks[bid]
        if bid == 0:
            raise Conflict("cache: block 0 is the null block; it is never cached", block_id=0)
        if rt.raw_refs[bid] <= 0:
            raise Conflict(
                f"cache: block {bid} is not held through the block API "
                "(allocate or touch it first)",
                block_id=bid,
                ref_cnt=block.ref_cnt,
            )
        if block.block_hash is not None:
            raise Conflict(f"cache: block {bid} is already cached", block_id=bid)
        if block.ref_cnt > rt.raw_refs[bid]:
            # A running request holds it too: the request caches its blocks as
            # they fill, and a hash set here would make that fail half-way.
            raise Conflict(
                f"cache: block {bid} belongs to a running request, which caches its "
                "blocks itself as they fill",
                block_id=bid,
            )


def _check_count(ids: list[int], n_hashes: int) -> None:
    if n_hashes != len(ids):
        raise InvalidInput(
            f"cache: {len(ids)} block(s) need {len(ids)} hashes, got {n_hashes}",
            expected=len(ids),
            given=n_hashes,
        )


def _store(
    rt: RuntimeState,
    ids: list[int],
    hashes: list[BlockHash],
    parent: BlockHash | None,
    tokens: list[int],
    lora: LoRARequest | None,
    group_id: int,
) -> None:
    """The pool's cache_full_blocks on the checked blocks (BlockStored names
    ``parent`` as the block before the first)."""
    bs = rt.config.block_size
    blocks = blocks_of(rt, ids)
    if parent is None:
        req = SimpleNamespace(block_hashes=hashes, all_token_ids=tokens, lora_request=lora)
        rt.pool.cache_full_blocks(req, blocks, 0, len(ids), bs, group_id)
    else:
        # Slot 0 stands for the parent block so that BlockStored names it.
        req = SimpleNamespace(
            block_hashes=[parent, *hashes], all_token_ids=[0] * bs + tokens, lora_request=lora
        )
        rt.pool.cache_full_blocks(req, [rt.pool.null_block, *blocks], 1, len(ids) + 1, bs, group_id)


def cache(rt: RuntimeState, op: CacheOp) -> Outcome[Cached]:
    ids = op.block_ids
    _check_blocks(rt, ids)
    if (op.token_ids is None) == (op.block_hashes is None):
        raise InvalidInput("cache: give exactly one of token_ids and block_hashes")
    if op.block_hashes is not None and (op.lora_name or op.cache_salt):
        raise InvalidInput("cache: lora_name and cache_salt apply to token_ids only")
    parent = BlockHash(bytes.fromhex(op.parent_block_hash)) if op.parent_block_hash else None
    if op.block_hashes is not None:
        _check_count(ids, len(op.block_hashes))
        hashes = [BlockHash(bytes.fromhex(h)) for h in op.block_hashes]
        tokens: list[int] = []
    else:
        check_tokens(rt, len(op.token_ids or []), "cache")
        hashes = _chain(rt, op, parent, len(ids))
        tokens = list(op.token_ids or [])
    lora = LoRARequest(op.lora_name) if op.lora_name else None
    _store(rt, ids, hashes, parent, tokens, lora, op.group_id)
    result: Cached = {"block_ids": list(ids), "block_hashes": [h.hex() for h in hashes]}
    return result, Change(ChangeKind.CACHE, sync=[ids], hashes=hashes)


# ------------------------------------------------------------ the engine's


@shape
class EngineCached(TypedDict):
    """The blocks an engine's cache operation made reachable (their hashes
    are the operation's own)."""

    block_ids: list[int]


class EngineCacheOp(OpRecord[EngineCached], kw_only=True):
    """What an engine's ``cache_full_blocks`` did, as a mirror applies it:
    the hashes raw, as the engine computed them, from its wire to the pool.

    Not a REST operation (the service's bodies are ``CacheOp``'s, hex); a
    recording holds it as it is and exports it as the ``cache`` operation it
    equals (``engine_cache_public``): its hashes are hexed there, once."""

    op: Literal["cache"] = "cache"
    block_ids: list[BlockId]
    block_hashes: list[RawHash]
    parent_block_hash: RawHash | None = None
    group_id: GroupId = 0


def engine_cache(rt: RuntimeState, op: EngineCacheOp) -> Outcome[EngineCached]:
    ids = op.block_ids
    _check_blocks(rt, ids)
    _check_count(ids, len(op.block_hashes))
    hashes = cast(list[BlockHash], op.block_hashes)
    parent = None if op.parent_block_hash is None else BlockHash(op.parent_block_hash)
    _store(rt, ids, hashes, parent, [], None, op.group_id)
    result: EngineCached = {"block_ids": list(ids)}
    return result, Change(ChangeKind.CACHE, sync=[ids], hashes=hashes)


def engine_cache_public(op: EngineCacheOp, ok: bool, payload: Any) -> tuple[CacheOp, Any]:
    """The ``cache`` operation ``op`` equals, and its result (a refusal's
    body stays as it is): what a recording exports, hex as the REST API's."""
    hexed = [h.hex() for h in op.block_hashes]
    public = CacheOp(
        block_ids=op.block_ids,
        block_hashes=hexed,
        parent_block_hash=None if op.parent_block_hash is None else op.parent_block_hash.hex(),
        group_id=op.group_id,
    )
    if ok:
        payload = {"block_ids": payload["block_ids"], "block_hashes": hexed}
    return public, payload


SPEC = OpSpec(CacheOp, cache, ChangeKind.CACHE)
ENGINE_SPEC = OpSpec(EngineCacheOp, engine_cache, ChangeKind.CACHE, public=engine_cache_public)
