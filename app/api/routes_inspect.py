"""Looking inside the pool: blocks, the LRU queue, the hash map, logs, series."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request

from app.api.costly import CostlyRead
from app.api.declare import returns, route
from app.api.deps import EngineDep, ReadAuth
from app.pool import storage_link
from app.pool.views import inspect as views
from app.pool.views import logs
from app.pool.views.inspect import Block, HashMap, PrefixTree, Queue
from app.pool.views.logs import Events, Samples, Series
from app.pool.views.summary import Health, Storage
from app.web.error_shape import ERROR_RESPONSES

router = APIRouter(prefix="/api", tags=["inspect"], responses=ERROR_RESPONSES)

EventType = Literal["BlockStored", "BlockRemoved", "AllBlocksCleared"]
Offset = Annotated[int, Query(ge=0, le=10_000_000)]
Since = Annotated[int, Query(ge=0, le=2**53)]  # a sequence number (bounded: islice needs it)
Limit = Annotated[int, Query(ge=1, le=10_000)]


@route(router.get, "/blocks/{block_id}", Block, "One block's details", ReadAuth)
async def block(engine: EngineDep, block_id: Annotated[int, Path(ge=0, le=2**31 - 1)]) -> Block:
    """State, ref count, hash, queue position, holders, sampled metrics."""
    return views.block(engine, block_id)


@route(router.get, "/queue", Queue, "The LRU free queue, paged", CostlyRead)
async def queue(engine: EngineDep, offset: Offset = 0, limit: Limit = 100) -> Queue:
    """In eviction order: position 0 is the next block to be reused."""
    return views.queue(engine, offset, limit)


@route(router.get, "/hashmap", HashMap, "The hash -> block map, paged", CostlyRead)
async def hash_map(
    engine: EngineDep,
    offset: Offset = 0,
    limit: Limit = 100,
    hash: Annotated[str | None, Query(pattern=r"^[0-9a-fA-F]{1,128}$")] = None,  # noqa: A002
    block_id: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    multi_only: bool = False,
) -> HashMap:
    """Search by hash prefix (digest or 64-bit form) or block id; ``multi_only``
    lists the keys holding several physical copies."""
    return views.hash_map(engine, offset, limit, hash, block_id, multi_only)


@route(router.get, "/prefix-tree", PrefixTree, "Cached prefixes as a tree", CostlyRead)
async def prefix_tree(
    engine: EngineDep, limit: Annotated[int, Query(ge=1, le=200_000)] = 20_000
) -> PrefixTree:
    """Every cached hash with its parent (from BlockStored events) and the
    blocks holding it: the tree of shared prefixes."""
    return views.prefix_tree(engine, limit)


@route(router.get, "/events", Events, "KV events since a sequence number", ReadAuth)
async def events(
    engine: EngineDep,
    since: Since = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    type: Annotated[list[EventType] | None, Query()] = None,  # noqa: A002
) -> Events:
    """``truncated`` is true when events after ``since`` were already dropped
    from the bounded log (``dropped_total`` counts them); ``type`` (repeatable)
    keeps only those event types."""
    return logs.events(engine, since, limit, set(type) if type else None)


@route(router.get, "/samples", Samples, "Eviction samples (residency)", ReadAuth)
async def samples(
    engine: EngineDep,
    since: Since = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Samples:
    return logs.samples(engine, since, limit)


@route(router.get, "/series", Series, "Recent time-series points", ReadAuth)
async def series(engine: EngineDep, limit: Annotated[int, Query(ge=1, le=6000)] = 600) -> Series:
    return logs.series(engine, limit)


@route(router.get, "/storage", Storage, "K/V storage memory facts", ReadAuth)
async def storage(engine: EngineDep, request: Request) -> Storage:
    """Device, dtype, bytes per block, bytes allocated, and the bytes holding
    live / cached / empty blocks now (``enabled: false`` without storage, with
    the ``reason``: turned off, or torch not installed)."""
    facts = engine.storage_facts()
    if facts is None:
        reason = request.app.state.storage_off or storage_link.OFF_BY_SETTING
        return Storage(enabled=False, reason=reason)
    return Storage(enabled=True, **facts)


@router.get("/health", responses=returns(Health), summary="Liveness")
async def health(engine: EngineDep) -> Health:
    return Health(status="ok", num_blocks=engine.pool.num_gpu_blocks)
