"""Operations on the pool, each validated as a whole before it changes anything.

``execute(engine, op)`` runs in the engine's context (through Engine.run_op).
Every check that can refuse an operation runs before the first mutation, so
a refused operation leaves the pool, the manager and the engine's columns
exactly as they were.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from app.errors import Conflict, InvalidInput, NotEnoughBlocks, NotFound, ResetRefused, TooLarge
from app.schemas import (
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
from blockpool import (
    BlockHash,
    KVCacheBlock,
    LoRARequest,
    NotEnoughBlocksError,
    RequestFinishedError,
    UnknownRequestError,
    hash_block_tokens,
)

if TYPE_CHECKING:
    from app.engine import Engine


def _hex(h: bytes) -> str:
    return h.hex()


def check_ids(engine: Engine, ids: Sequence[int], what: str) -> None:
    limit = engine.settings.max_ids_per_call
    if len(ids) > limit:
        raise TooLarge(
            f"{what}: {len(ids)} block ids in one call, the limit is {limit}",
            given=len(ids),
            limit=limit,
        )
    n = engine.pool.num_gpu_blocks
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise InvalidInput(
            f"{what}: block id {bad[0]} is outside the pool (ids 0..{n - 1})",
            invalid_ids=bad[:20],
            num_blocks=n,
        )


def check_tokens(engine: Engine, n: int, what: str) -> None:
    limit = engine.settings.max_tokens_per_request
    if n > limit:
        raise TooLarge(
            f"{what}: {n} tokens, the limit per request is {limit}", given=n, limit=limit
        )


# ------------------------------------------------------------- raw blocks


def allocate(engine: Engine, op: AllocateOp) -> dict[str, Any]:
    n = op.num_blocks
    limit = engine.settings.max_ids_per_call
    if n > limit:
        raise TooLarge(f"allocate: {n} blocks in one call, the limit is {limit}", limit=limit)
    free = engine.pool.get_num_free_blocks()
    if n > free:
        raise NotEnoughBlocks(
            f"allocate needs {n} free block(s) but only {free} are free", requested=n, free=free
        )
    cols = engine.columns
    blocks = engine.pool.get_new_blocks(n)
    ids = [b.block_id for b in blocks]
    evicted = [i for i in ids if cols.hashed[i]]
    if engine.hooks is not None:
        engine.hooks.on_allocate(ids)
    engine.raw_refs[ids] += 1
    cols.sync(ids)
    engine.counters.blocks_allocated += n
    return {"block_ids": ids, "evicted": evicted}


def _blocks(engine: Engine, ids: Sequence[int]) -> list[KVCacheBlock]:
    blocks = engine.pool.blocks
    return [blocks[i] for i in ids]


def free(engine: Engine, op: FreeOp) -> dict[str, Any]:
    ids = op.block_ids
    check_ids(engine, ids, "free")
    raw = engine.raw_refs
    pool_blocks = engine.pool.blocks
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
    blocks = _blocks(engine, ids)
    engine.pool.free_blocks(blocks)
    for bid in ids:
        raw[bid] -= 1
    first_stamp = engine.columns.next_stamp
    engine.columns.stamp_freed(blocks)
    if engine.hooks is not None:
        engine.hooks.on_freed(first_stamp)
    engine.columns.sync(ids)
    engine.counters.blocks_freed += len(ids)
    now_free = [b.block_id for b in blocks if b.ref_cnt == 0]
    return {"freed": list(ids), "now_free": now_free}


def touch(engine: Engine, op: TouchOp) -> dict[str, Any]:
    ids = op.block_ids
    check_ids(engine, ids, "touch")
    if 0 in ids:
        raise Conflict("touch: block 0 is the null block; it cannot be touched", block_id=0)
    blocks = _blocks(engine, ids)
    engine.pool.touch(blocks)
    for bid in ids:
        engine.raw_refs[bid] += 1
    engine.columns.sync(ids)
    engine.counters.blocks_touched += len(ids)
    return {"block_ids": list(ids), "ref_cnts": [b.ref_cnt for b in blocks]}


def _chain(engine: Engine, op: CacheOp, parent: BlockHash | None, n: int) -> list[BlockHash]:
    bs = engine.settings.block_size
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
            engine.hash_fn, parent, tokens[i * bs : (i + 1) * bs], tuple(keys) if keys else None
        )
        hashes.append(parent)
    return hashes


def cache(engine: Engine, op: CacheOp) -> dict[str, Any]:
    ids = op.block_ids
    check_ids(engine, ids, "cache")
    if len(set(ids)) != len(ids):
        raise InvalidInput("cache: block ids must be distinct", block_ids=ids[:50])
    if (op.token_ids is None) == (op.block_hashes is None):
        raise InvalidInput("cache: give exactly one of token_ids and block_hashes")
    if op.block_hashes is not None and (op.lora_name or op.cache_salt):
        raise InvalidInput("cache: lora_name and cache_salt apply to token_ids only")
    for bid in ids:
        block = engine.pool.blocks[bid]
        if bid == 0:
            raise Conflict("cache: block 0 is the null block; it is never cached", block_id=0)
        if engine.raw_refs[bid] <= 0:
            raise Conflict(
                f"cache: block {bid} is not held through the block API "
                "(allocate or touch it first)",
                block_id=bid,
                ref_cnt=block.ref_cnt,
            )
        if block.block_hash is not None:
            raise Conflict(f"cache: block {bid} is already cached", block_id=bid)
        if block.ref_cnt > engine.raw_refs[bid]:
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
        check_tokens(engine, len(op.token_ids or []), "cache")
        hashes = _chain(engine, op, parent, len(ids))
        tokens = list(op.token_ids or [])
    bs = engine.settings.block_size
    blocks = _blocks(engine, ids)
    lora = LoRARequest(op.lora_name) if op.lora_name else None
    if parent is None:
        req = SimpleNamespace(block_hashes=hashes, all_token_ids=tokens, lora_request=lora)
        engine.pool.cache_full_blocks(req, blocks, 0, len(ids), bs, op.group_id)
    else:
        # Slot 0 stands for the parent block so that BlockStored names it.
        req = SimpleNamespace(
            block_hashes=[parent, *hashes], all_token_ids=[0] * bs + tokens, lora_request=lora
        )
        engine.pool.cache_full_blocks(
            req, [engine.pool.null_block, *blocks], 1, len(ids) + 1, bs, op.group_id
        )
    if engine.hooks is not None:
        engine.hooks.on_cache(hashes)
    engine.columns.sync(ids)
    return {"block_ids": list(ids), "block_hashes": [_hex(h) for h in hashes]}


def lookup(engine: Engine, op: LookupOp) -> dict[str, Any]:
    found = engine.pool.get_cached_block(BlockHash(bytes.fromhex(op.block_hash)), op.group_ids)
    return {
        "hit": found is not None,
        "group_ids": op.group_ids,
        "block_ids": None if found is None else [b.block_id for b in found],
    }


def prefix_lookup(engine: Engine, op: PrefixLookupOp) -> dict[str, Any]:
    check_tokens(engine, len(op.token_ids), "prefix_lookup")
    hit_tokens = engine.manager.lookup(
        op.token_ids, lora_name=op.lora_name, cache_salt=op.cache_salt
    )
    return {
        "num_tokens": len(op.token_ids),
        "num_hit_tokens": hit_tokens,
        "num_hit_blocks": hit_tokens // engine.manager.block_size,
    }


def evict(engine: Engine, op: EvictOp) -> dict[str, Any]:
    check_ids(engine, op.block_ids, "evict")  # the ids as given (as /batch checks them)
    ids = list(dict.fromkeys(op.block_ids))
    cols = engine.columns
    evicted = [i for i in ids if cols.hashed[i]]
    engine.pool.evict_blocks(ids)
    if engine.hooks is not None:
        engine.hooks.on_evict(evicted)
    cols.sync(ids)
    gone = set(evicted)
    return {"evicted": evicted, "not_cached": [i for i in ids if i not in gone]}


def reset(engine: Engine, op: ResetOp) -> dict[str, Any]:
    pool = engine.pool
    held = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    if not pool.reset_prefix_cache():
        engine.counters.resets_refused += 1
        raise ResetRefused(
            f"reset refused: {held} block(s) are still held; free them or finish the "
            f"{len(engine.manager.requests)} running request(s) first",
            held_blocks=held,
            running_requests=len(engine.manager.requests),
        )
    engine.counters.resets += 1
    if engine.hooks is not None:
        engine.hooks.on_reset()
    engine.mark_all_dirty()
    return {"reset": True}


# ------------------------------------------------------------- requests


def _sync_tables(engine: Engine, tables: list[list[int]]) -> None:
    for ids in tables:
        engine.columns.sync(ids)


def admit(engine: Engine, op: AdmitOp) -> dict[str, Any]:
    mgr = engine.manager
    check_tokens(engine, len(op.token_ids), "admit")
    rid = op.request_id or engine.new_request_id()
    if rid in mgr.requests:
        raise Conflict(f"admit: request {rid!r} is already running", request_id=rid)
    if len(mgr.requests) >= engine.settings.max_requests:
        raise Conflict(
            f"admit: {len(mgr.requests)} requests are running, the limit is "
            f"{engine.settings.max_requests}",
            limit=engine.settings.max_requests,
        )
    try:
        adm = mgr.admit(rid, op.token_ids, lora_name=op.lora_name, cache_salt=op.cache_salt)
    except NotEnoughBlocksError as exc:
        engine.counters.requests_refused += 1
        raise NotEnoughBlocks(
            f"admit: {exc}", requested=exc.requested, free=exc.free, request_id=rid
        ) from None
    bs = engine.manager.block_size
    engine.tail_waste += (len(adm.block_ids[0]) * bs - len(op.token_ids)) * len(adm.block_ids)
    if engine.hooks is not None:
        engine.hooks.on_admit(rid, op, adm)
    _sync_tables(engine, adm.block_ids)
    engine.counters.requests_admitted += 1
    engine.counters.blocks_allocated += adm.num_new_blocks
    engine.counters.blocks_touched += adm.num_hit_blocks * len(adm.block_ids)
    if engine.storage is not None:
        engine.storage_write(rid, adm.num_computed_tokens)
    return {
        "request_id": rid,
        "block_ids": adm.block_ids,
        "num_tokens": len(op.token_ids),
        "num_hit_blocks": adm.num_hit_blocks,
        "num_computed_tokens": adm.num_computed_tokens,
        "num_new_blocks": adm.num_new_blocks,
    }


def _managed(engine: Engine, rid: str, what: str) -> Any:
    try:
        return engine.manager.get(rid)
    except RequestFinishedError:
        raise Conflict(f"{what}: request {rid!r} was already finished", request_id=rid) from None
    except UnknownRequestError:
        raise NotFound(f"{what}: no running request {rid!r}", request_id=rid) from None


def append(engine: Engine, op: AppendOp) -> dict[str, Any]:
    managed = _managed(engine, op.request_id, "append")
    before_tokens = managed.num_tokens
    check_tokens(engine, before_tokens + len(op.token_ids), "append")
    before_cached = managed.num_cached_blocks
    try:
        added = engine.manager.append_tokens(op.request_id, op.token_ids)
    except NotEnoughBlocksError as exc:
        raise NotEnoughBlocks(
            f"append: {exc}", requested=exc.requested, free=exc.free, request_id=op.request_id
        ) from None
    bs = engine.manager.block_size
    groups = len(added)
    engine.tail_waste += (len(added[0]) * bs - len(op.token_ids)) * groups
    if engine.hooks is not None:
        engine.hooks.on_append(op.request_id, managed, before_tokens, before_cached, added)
    for table, new_ids in zip(managed.block_tables, added, strict=True):
        engine.columns.sync(new_ids)
        engine.columns.sync(b.block_id for b in table[before_cached : managed.num_cached_blocks])
    engine.counters.blocks_allocated += sum(len(a) for a in added)
    if engine.storage is not None:
        engine.storage_write(op.request_id, before_tokens)
    return {"request_id": op.request_id, "new_block_ids": added, "num_tokens": managed.num_tokens}


def finish(engine: Engine, op: FinishOp) -> dict[str, Any]:
    managed = _managed(engine, op.request_id, "finish")
    tables = [list(t) for t in managed.block_tables]
    bs = engine.manager.block_size
    engine.tail_waste -= (len(tables[0]) * bs - managed.num_tokens) * len(tables)
    freed = engine.manager.finish(op.request_id)
    first_stamp = engine.columns.next_stamp
    for table in tables:
        engine.columns.stamp_freed(reversed(table))
    if engine.hooks is not None:
        engine.hooks.on_finish(op.request_id, managed, first_stamp)
    _sync_tables(engine, freed)
    engine.counters.requests_finished += 1
    engine.counters.blocks_freed += sum(len(t) for t in freed)
    return {"request_id": op.request_id, "freed_block_ids": freed}


HANDLERS: dict[type, Callable[[Engine, Any], dict[str, Any]]] = {
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


def execute(engine: Engine, op: Any) -> dict[str, Any]:
    """Apply one validated operation model (engine context)."""
    return HANDLERS[type(op)](engine, op)


def precheck(engine: Engine, op: Any) -> None:
    """Limits that need no pool state (run on a whole batch before any op)."""
    ids = getattr(op, "block_ids", None)
    if isinstance(ids, list):
        check_ids(engine, ids, op.op)
    tokens = getattr(op, "token_ids", None)
    if isinstance(tokens, list):
        check_tokens(engine, len(tokens), op.op)
    if isinstance(op, AllocateOp) and op.num_blocks > engine.settings.max_ids_per_call:
        raise TooLarge(
            f"allocate: {op.num_blocks} blocks in one call, the limit is "
            f"{engine.settings.max_ids_per_call}",
            limit=engine.settings.max_ids_per_call,
        )
