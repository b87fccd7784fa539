"""One handler per operation, each validated as a whole before it changes anything.

A handler checks everything that can refuse the operation, changes the pool
(and the manager, the raw references, the counters), and returns its result
with a ``Change``: what the runtime then tells its observer and re-reads
into the columns (``PoolRuntime.execute``, in one documented order).  A
refused operation raises an ``OperationError`` and leaves everything as it
was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from blockpool.errors import NotEnoughBlocksError, RequestFinishedError, UnknownRequestError
from blockpool.hashing import BlockHash, hash_block_tokens
from blockpool.request import LoRARequest
from blockpool.runtime.errors import (
    Conflict,
    InvalidInput,
    NotEnoughBlocks,
    NotFound,
    ResetRefused,
    TooLarge,
)
from blockpool.runtime.observer import Change
from blockpool.runtime.ops import (
    AdmitOp,
    AllocateOp,
    AppendOp,
    CacheOp,
    EvictOp,
    FinishOp,
    FreeOp,
    LookupOp,
    PrefixLookupOp,
    ResetOp,
    TouchOp,
)

if TYPE_CHECKING:
    import numpy as np

    from blockpool.block import KVCacheBlock
    from blockpool.hashing import HashFn
    from blockpool.manager import RequestManager
    from blockpool.pool import BlockPool
    from blockpool.runtime.columns import BlockColumns
    from blockpool.runtime.config import RuntimeConfig
    from blockpool.runtime.counters import Counters


class PoolRuntime(Protocol):
    """What the handlers change (blockpool.runtime.runtime.PoolRuntime)."""

    config: RuntimeConfig
    pool: BlockPool
    manager: RequestManager
    columns: BlockColumns
    raw_refs: np.ndarray
    counters: Counters
    hash_fn: HashFn
    tail_waste: int

    def new_request_id(self) -> str: ...


Outcome = tuple[dict[str, Any], Change | None]


def check_ids(rt: PoolRuntime, ids: Sequence[int], what: str) -> None:
    limit = rt.config.max_ids_per_call
    if len(ids) > limit:
        raise TooLarge(
            f"{what}: {len(ids)} block ids in one call, the limit is {limit}",
            given=len(ids),
            limit=limit,
        )
    n = rt.pool.num_gpu_blocks
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise InvalidInput(
            f"{what}: block id {bad[0]} is outside the pool (ids 0..{n - 1})",
            invalid_ids=bad[:20],
            num_blocks=n,
        )


def check_tokens(rt: PoolRuntime, n: int, what: str) -> None:
    limit = rt.config.max_tokens_per_request
    if n > limit:
        raise TooLarge(
            f"{what}: {n} tokens, the limit per request is {limit}", given=n, limit=limit
        )


# ------------------------------------------------------------- raw blocks


def allocate(rt: PoolRuntime, op: AllocateOp) -> Outcome:
    n = op.num_blocks
    limit = rt.config.max_ids_per_call
    if n > limit:
        raise TooLarge(f"allocate: {n} blocks in one call, the limit is {limit}", limit=limit)
    free = rt.pool.get_num_free_blocks()
    if n > free:
        raise NotEnoughBlocks(
            f"allocate needs {n} free block(s) but only {free} are free", requested=n, free=free
        )
    blocks = rt.pool.get_new_blocks(n)
    ids = [b.block_id for b in blocks]
    hashed = rt.columns.hashed
    evicted = [i for i in ids if hashed[i]]
    rt.raw_refs[ids] += 1
    change = Change("allocate", sync=[ids], ids=ids, allocated=n)
    return {"block_ids": ids, "evicted": evicted}, change


def _blocks(rt: PoolRuntime, ids: Sequence[int]) -> list[KVCacheBlock]:
    blocks = rt.pool.blocks
    return [blocks[i] for i in ids]


def free(rt: PoolRuntime, op: FreeOp) -> Outcome:
    ids = op.block_ids
    check_ids(rt, ids, "free")
    raw = rt.raw_refs
    pool_blocks = rt.pool.blocks
    for bid, times in Counter(ids).items():
        if bid == 0:
            raise Conflict("free: block 0 is the null block; it is never freed", block_id=0)
        held = int(raw[bid])
        if times > held:
            ref = pool_blocks[bid].ref_cnt
            if ref == 0:
                msg = f"free: block {bid} is already free"
            elif held == 0:
                msg = (
                    f"free: block {bid} is held by a request, not through the block API; "
                    "finish the request instead"
                )
            else:
                msg = f"free: block {bid} is held {held} time(s) but would be freed {times} time(s)"
            raise Conflict(msg, block_id=bid, held=held, freed=times, ref_cnt=ref)
    blocks = _blocks(rt, ids)
    rt.pool.free_blocks(blocks)
    for bid in ids:
        raw[bid] -= 1
    rt.counters.blocks_freed += len(ids)
    now_free = [b.block_id for b in blocks if b.ref_cnt == 0]
    return {"freed": list(ids), "now_free": now_free}, Change("free", sync=[ids], freed=[blocks])


def touch(rt: PoolRuntime, op: TouchOp) -> Outcome:
    ids = op.block_ids
    check_ids(rt, ids, "touch")
    if 0 in ids:
        raise Conflict("touch: block 0 is the null block; it cannot be touched", block_id=0)
    blocks = _blocks(rt, ids)
    rt.pool.touch(blocks)
    for bid in ids:
        rt.raw_refs[bid] += 1
    rt.counters.blocks_touched += len(ids)
    result = {"block_ids": list(ids), "ref_cnts": [b.ref_cnt for b in blocks]}
    return result, Change("touch", sync=[ids])


def _chain(rt: PoolRuntime, op: CacheOp, parent: BlockHash | None, n: int) -> list[BlockHash]:
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


def cache(rt: PoolRuntime, op: CacheOp) -> Outcome:
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
    blocks = _blocks(rt, ids)
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
    result = {"block_ids": list(ids), "block_hashes": [h.hex() for h in hashes]}
    return result, Change("cache", sync=[ids], hashes=hashes)


def lookup(rt: PoolRuntime, op: LookupOp) -> Outcome:
    found = rt.pool.get_cached_block(BlockHash(bytes.fromhex(op.block_hash)), op.group_ids)
    result = {
        "hit": found is not None,
        "group_ids": op.group_ids,
        "block_ids": None if found is None else [b.block_id for b in found],
    }
    return result, None


def prefix_lookup(rt: PoolRuntime, op: PrefixLookupOp) -> Outcome:
    check_tokens(rt, len(op.token_ids), "prefix_lookup")
    hit_tokens = rt.manager.lookup(op.token_ids, lora_name=op.lora_name, cache_salt=op.cache_salt)
    result = {
        "num_tokens": len(op.token_ids),
        "num_hit_tokens": hit_tokens,
        "num_hit_blocks": hit_tokens // rt.manager.block_size,
    }
    return result, None


def evict(rt: PoolRuntime, op: EvictOp) -> Outcome:
    check_ids(rt, op.block_ids, "evict")  # the ids as given (as /batch checks them)
    ids = list(dict.fromkeys(op.block_ids))
    hashed = rt.columns.hashed
    evicted = [i for i in ids if hashed[i]]
    rt.pool.evict_blocks(ids)
    gone = set(evicted)
    result = {"evicted": evicted, "not_cached": [i for i in ids if i not in gone]}
    return result, Change("evict", sync=[ids], ids=evicted)


def reset(rt: PoolRuntime, op: ResetOp) -> Outcome:
    pool = rt.pool
    held = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    if not pool.reset_prefix_cache():
        rt.counters.resets_refused += 1
        raise ResetRefused(
            f"reset refused: {held} block(s) are still held; free them or finish the "
            f"{len(rt.manager.requests)} running request(s) first",
            held_blocks=held,
            running_requests=len(rt.manager.requests),
        )
    rt.counters.resets += 1
    return {"reset": True}, Change("reset")


# ------------------------------------------------------------- requests


def admit(rt: PoolRuntime, op: AdmitOp) -> Outcome:
    mgr = rt.manager
    check_tokens(rt, len(op.token_ids), "admit")
    rid = op.request_id or rt.new_request_id()
    if rid in mgr.requests:
        raise Conflict(f"admit: request {rid!r} is already running", request_id=rid)
    limit = rt.config.max_requests
    if len(mgr.requests) >= limit:
        raise Conflict(
            f"admit: {len(mgr.requests)} requests are running, the limit is {limit}",
            limit=limit,
        )
    try:
        adm = mgr.admit(rid, op.token_ids, lora_name=op.lora_name, cache_salt=op.cache_salt)
    except NotEnoughBlocksError as exc:
        rt.counters.requests_refused += 1
        raise NotEnoughBlocks(
            f"admit: {exc}", requested=exc.requested, free=exc.free, request_id=rid
        ) from None
    bs = mgr.block_size
    rt.tail_waste += (len(adm.block_ids[0]) * bs - len(op.token_ids)) * len(adm.block_ids)
    c = rt.counters
    c.requests_admitted += 1
    c.blocks_touched += adm.num_hit_blocks * len(adm.block_ids)
    result = {
        "request_id": rid,
        "block_ids": adm.block_ids,
        "num_tokens": len(op.token_ids),
        "num_hit_blocks": adm.num_hit_blocks,
        "num_computed_tokens": adm.num_computed_tokens,
        "num_new_blocks": adm.num_new_blocks,
    }
    change = Change(
        "admit",
        sync=adm.block_ids,
        request_id=rid,
        op=op,
        admission=adm,
        managed=mgr.requests[rid],
        write_from=adm.num_computed_tokens,
        allocated=adm.num_new_blocks,
    )
    return result, change


def _managed(rt: PoolRuntime, rid: str, what: str) -> Any:
    try:
        return rt.manager.get(rid)
    except RequestFinishedError:
        raise Conflict(f"{what}: request {rid!r} was already finished", request_id=rid) from None
    except UnknownRequestError:
        raise NotFound(f"{what}: no running request {rid!r}", request_id=rid) from None


def append(rt: PoolRuntime, op: AppendOp) -> Outcome:
    managed = _managed(rt, op.request_id, "append")
    before_tokens = managed.num_tokens
    check_tokens(rt, before_tokens + len(op.token_ids), "append")
    before_cached = managed.num_cached_blocks
    try:
        added = rt.manager.append_tokens(op.request_id, op.token_ids)
    except NotEnoughBlocksError as exc:
        raise NotEnoughBlocks(
            f"append: {exc}", requested=exc.requested, free=exc.free, request_id=op.request_id
        ) from None
    bs = rt.manager.block_size
    rt.tail_waste += (len(added[0]) * bs - len(op.token_ids)) * len(added)
    sync: list[Any] = []
    for table, new_ids in zip(managed.block_tables, added, strict=True):
        sync.append(new_ids)
        sync.append([b.block_id for b in table[before_cached : managed.num_cached_blocks]])
    result = {
        "request_id": op.request_id,
        "new_block_ids": added,
        "num_tokens": managed.num_tokens,
    }
    change = Change(
        "append",
        sync=sync,
        request_id=op.request_id,
        managed=managed,
        before_tokens=before_tokens,
        before_cached=before_cached,
        added=added,
        write_from=before_tokens,
        allocated=sum(len(a) for a in added),
    )
    return result, change


def finish(rt: PoolRuntime, op: FinishOp) -> Outcome:
    managed = _managed(rt, op.request_id, "finish")
    tables = [list(t) for t in managed.block_tables]
    bs = rt.manager.block_size
    rt.tail_waste -= (len(tables[0]) * bs - managed.num_tokens) * len(tables)
    freed = rt.manager.finish(op.request_id)
    rt.counters.requests_finished += 1
    rt.counters.blocks_freed += sum(len(t) for t in freed)
    result = {"request_id": op.request_id, "freed_block_ids": freed}
    change = Change(
        "finish",
        sync=freed,
        freed=[t[::-1] for t in tables],
        request_id=op.request_id,
        managed=managed,
    )
    return result, change


HANDLERS: dict[type, Callable[[PoolRuntime, Any], Outcome]] = {
    AllocateOp: allocate,
    FreeOp: free,
    TouchOp: touch,
    CacheOp: cache,
    LookupOp: lookup,
    PrefixLookupOp: prefix_lookup,
    EvictOp: evict,
    ResetOp: reset,
    AdmitOp: admit,
    AppendOp: append,
    FinishOp: finish,
}


def precheck(rt: PoolRuntime, op: Any) -> None:
    """Limits that need no pool state (run on a whole batch before any op)."""
    ids = getattr(op, "block_ids", None)
    if isinstance(ids, list):
        check_ids(rt, ids, op.op)
    tokens = getattr(op, "token_ids", None)
    if isinstance(tokens, list):
        check_tokens(rt, len(tokens), op.op)
    limit = rt.config.max_ids_per_call
    if isinstance(op, AllocateOp) and op.num_blocks > limit:
        raise TooLarge(
            f"allocate: {op.num_blocks} blocks in one call, the limit is {limit}", limit=limit
        )
