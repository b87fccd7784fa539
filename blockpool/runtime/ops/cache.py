"""Make held blocks reachable by hash: the record, its handler and its declaration."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated, Any, Literal

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
from blockpool.runtime.ops.fields import BlockId, ExtraKey, GroupId, HexHash, TokenId


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


def cache(rt: RuntimeState, op: CacheOp) -> Outcome[Cached]:
    ids = op.block_ids
    check_ids(rt, ids, "cache")
    if len(set(ids)) != len(ids):
        raise InvalidInput("cache: block ids must be distinct", block_ids=ids[:50])
    if (op.token_ids is None) == (op.block_hashes is None):
        raise InvalidInput("cache: give exactly one of token_ids and block_hashes")
    if op.block_hashes is not None and (op.lora_name or op.cache_salt):
        raise InvalidInput("cache: lora_name and cache_salt apply to token_ids only")
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
    parent = BlockHash(bytes.fromhex(op.parent_block_hash)) if op.parent_block_hash else None
    if op.block_hashes is not None:
        if len(op.block_hashes) != len(ids):
            raise InvalidInput(
                f"cache: {len(ids)} block(s) need {len(ids)} hashes, got {len(op.block_hashes)}",
                expected=len(ids),
                given=len(op.block_hashes),
            )
        hashes = [BlockHash(bytes.fromhex(h)) for h in op.block_hashes]
        tokens: list[int] = []
    else:
        check_tokens(rt, len(op.token_ids or []), "cache")
        hashes = _chain(rt, op, parent, len(ids))
        tokens = list(op.token_ids or [])
    bs = rt.config.block_size
    blocks = blocks_of(rt, ids)
    lora = LoRARequest(op.lora_name) if op.lora_name else None
    if parent is None:
        req = SimpleNamespace(block_hashes=hashes, all_token_ids=tokens, lora_request=lora)
        rt.pool.cache_full_blocks(req, blocks, 0, len(ids), bs, op.group_id)
    else:
        # Slot 0 stands for the parent block so that BlockStored names it.
        req = SimpleNamespace(
            block_hashes=[parent, *hashes], all_token_ids=[0] * bs + tokens, lora_request=lora
        )
        rt.pool.cache_full_blocks(
            req, [rt.pool.null_block, *blocks], 1, len(ids) + 1, bs, op.group_id
        )
    result: Cached = {"block_ids": list(ids), "block_hashes": [h.hex() for h in hashes]}
    return result, Change(ChangeKind.CACHE, sync=[ids], hashes=hashes)


SPEC = OpSpec(CacheOp, cache, ChangeKind.CACHE)
