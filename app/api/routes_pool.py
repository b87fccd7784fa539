"""The pool itself: config, summary, and vLLM's operations by block id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.costly import CostlyRead
from app.api.declare import AsBuilt, route
from app.api.deps import EngineDep, ReadAuth, WriteAuth, run
from app.pool.schemas import (
    AllocateBody,
    CacheBody,
    EvictBody,
    FreeBody,
    GroupId,
    HexHash,
    LookupOp,
    PrefixLookupBody,
    ResetOp,
    TouchBody,
)
from app.pool.views import summary as views
from app.pool.views.summary import Config, Summary
from app.web.error_shape import ERROR_RESPONSES
from blockpool.runtime.ops import (
    Allocated,
    Cached,
    Evicted,
    Freed,
    Lookup,
    PrefixLookup,
    Reset,
    Touched,
)

router = APIRouter(prefix="/api", tags=["pool"], responses=ERROR_RESPONSES)


@route(router.get, "/config", Config, "Pool and server configuration", ReadAuth)
async def get_config(engine: EngineDep) -> Config:
    return views.config(engine)


@route(router.get, "/summary", Summary, "Live summary of the pool", ReadAuth)
async def get_summary(engine: EngineDep) -> Summary:
    """Blocks in use / cached-evictable / empty, usage, hit rate, counters."""
    return views.summary(engine)


@route(router.post, "/pool/allocate", Allocated, "get_new_blocks(n)", WriteAuth)
async def allocate(op: AllocateBody, engine: EngineDep) -> AsBuilt[Allocated]:
    """Blocks come from the free queue's head; cached ones lose their hash
    (listed in ``evicted``).  409 with requested vs free when too few."""
    return await run(engine, op)


@route(router.post, "/pool/free", Freed, "free_blocks(ordered ids)", WriteAuth)
async def free(op: FreeBody, engine: EngineDep) -> AsBuilt[Freed]:
    """Only blocks held through this API (allocate/touch) can be freed here;
    blocks of a request are freed by finishing it."""
    return await run(engine, op)


@route(router.post, "/pool/touch", Touched, "touch(ids)", WriteAuth)
async def touch(op: TouchBody, engine: EngineDep) -> AsBuilt[Touched]:
    return await run(engine, op)


@route(router.post, "/pool/cache", Cached, "cache_full_blocks", WriteAuth)
async def cache(op: CacheBody, engine: EngineDep) -> AsBuilt[Cached]:
    return await run(engine, op)


@route(router.post, "/pool/evict", Evicted, "evict_blocks(ids)", WriteAuth)
async def evict(op: EvictBody, engine: EngineDep) -> AsBuilt[Evicted]:
    return await run(engine, op)


@route(router.post, "/pool/reset", Reset, "reset_prefix_cache()", WriteAuth)
async def reset(engine: EngineDep) -> AsBuilt[Reset]:
    """409 ``reset_refused`` with the number of held blocks when any block is
    held: a refused reset never looks like success."""
    return await run(engine, ResetOp())


@route(router.get, "/pool/lookup", Lookup, "get_cached_block(hash, groups)", ReadAuth)
async def lookup(
    engine: EngineDep,
    block_hash: HexHash,
    group_id: Annotated[list[GroupId], Query(min_length=1, max_length=64)] = [0],  # noqa: B006
) -> AsBuilt[Lookup]:
    """All-or-nothing across groups: a miss in any group is a miss."""
    group_ids = list(group_id)
    return await run(engine, LookupOp(block_hash=block_hash, group_ids=group_ids))


@route(router.post, "/pool/prefix-lookup", PrefixLookup, "Cached prefix of a prompt", CostlyRead)
async def prefix_lookup(op: PrefixLookupBody, engine: EngineDep) -> AsBuilt[PrefixLookup]:
    """How many leading tokens would hit now; changes nothing."""
    return await run(engine, op)
