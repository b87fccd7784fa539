"""The pool itself: config, summary, and vLLM's operations by block id."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from app import views
from app.api.costly import CostlyRead
from app.api.deps import EngineDep, ReadAuth, WriteAuth, run
from app.api.errors import ERROR_RESPONSES
from app.api.responses import pool as r
from app.api.responses import returns
from app.schemas import (
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

router = APIRouter(prefix="/api", tags=["pool"], responses=ERROR_RESPONSES)


@router.get(
    "/config",
    responses=returns(r.Config),
    dependencies=[ReadAuth],
    summary="Pool and server configuration",
)
async def get_config(engine: EngineDep) -> dict[str, Any]:
    return views.config(engine)


@router.get(
    "/summary",
    responses=returns(r.Summary),
    dependencies=[ReadAuth],
    summary="Live summary of the pool",
)
async def get_summary(engine: EngineDep) -> dict[str, Any]:
    """Blocks in use / cached-evictable / empty, usage, hit rate, counters."""
    return views.summary(engine)


@router.post(
    "/pool/allocate",
    responses=returns(r.Allocated),
    dependencies=[WriteAuth],
    summary="get_new_blocks(n)",
)
async def allocate(op: AllocateBody, engine: EngineDep) -> dict[str, Any]:
    """Blocks come from the free queue's head; cached ones lose their hash
    (listed in ``evicted``).  409 with requested vs free when too few."""
    return await run(engine, op)


@router.post(
    "/pool/free",
    responses=returns(r.Freed),
    dependencies=[WriteAuth],
    summary="free_blocks(ordered ids)",
)
async def free(op: FreeBody, engine: EngineDep) -> dict[str, Any]:
    """Only blocks held through this API (allocate/touch) can be freed here;
    blocks of a request are freed by finishing it."""
    return await run(engine, op)


@router.post(
    "/pool/touch", responses=returns(r.Touched), dependencies=[WriteAuth], summary="touch(ids)"
)
async def touch(op: TouchBody, engine: EngineDep) -> dict[str, Any]:
    return await run(engine, op)


@router.post(
    "/pool/cache",
    responses=returns(r.Cached),
    dependencies=[WriteAuth],
    summary="cache_full_blocks",
)
async def cache(op: CacheBody, engine: EngineDep) -> dict[str, Any]:
    return await run(engine, op)


@router.post(
    "/pool/evict",
    responses=returns(r.Evicted),
    dependencies=[WriteAuth],
    summary="evict_blocks(ids)",
)
async def evict(op: EvictBody, engine: EngineDep) -> dict[str, Any]:
    return await run(engine, op)


@router.post(
    "/pool/reset",
    responses=returns(r.Reset),
    dependencies=[WriteAuth],
    summary="reset_prefix_cache()",
)
async def reset(engine: EngineDep) -> dict[str, Any]:
    """409 ``reset_refused`` with the number of held blocks when any block is
    held: a refused reset never looks like success."""
    return await run(engine, ResetOp())


@router.get(
    "/pool/lookup",
    responses=returns(r.Lookup),
    dependencies=[ReadAuth],
    summary="get_cached_block(hash, groups)",
)
async def lookup(
    engine: EngineDep,
    block_hash: HexHash,
    group_id: Annotated[list[GroupId], Query(min_length=1, max_length=64)] = [0],  # noqa: B006
) -> dict[str, Any]:
    """All-or-nothing across groups: a miss in any group is a miss."""
    group_ids = list(group_id)
    return await run(engine, LookupOp(block_hash=block_hash, group_ids=group_ids))


@router.post(
    "/pool/prefix-lookup",
    responses=returns(r.PrefixLookup),
    dependencies=[CostlyRead],
    summary="Cached prefix of a prompt",
)
async def prefix_lookup(op: PrefixLookupBody, engine: EngineDep) -> dict[str, Any]:
    """How many leading tokens would hit now; changes nothing."""
    return await run(engine, op)
