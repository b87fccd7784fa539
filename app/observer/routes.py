"""The observer's REST routes (the list: ``observer_app.py``; the reference:
docs/observer.md): the fleet's health, who holds which prefixes, and one
pool's hash map, prefix tree and event log."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from app.observer.bearer import Auth
from app.observer.fleet import CANNOT_KNOW, Fleet
from app.observer.hub import FleetHub
from app.observer.source import Source
from app.shared.errors import InvalidInput, NotFound
from blockpool.kvevents.event_json import event_json
from blockpool.kvevents.hashes import Hash, hash_hex, parse_hash
from blockpool.kvevents.state import entry_json
from blockpool.runtime.prefix_tree import breadth_first

MAX_QUERY_ITEMS = 1_000_000


def get_fleet(request: Request) -> Fleet:
    fleet: Fleet = request.app.state.fleet
    return fleet


FleetDep = Annotated[Fleet, Depends(get_fleet)]


def _source(fleet: Fleet, instance: str) -> Source:
    s = fleet.get(instance)
    if s is None:
        raise NotFound(f"no pool named {instance!r}", instance=instance, known=list(fleet.sources))
    return s


def _split(text: str, what: str) -> list[str]:
    """A comma- (or space-) separated list, at most MAX_QUERY_ITEMS long."""
    parts = [p for p in text.replace(" ", ",").split(",") if p]
    if len(parts) > MAX_QUERY_ITEMS:
        raise InvalidInput(f"at most {MAX_QUERY_ITEMS} {what}")
    return parts


def _parse_hashes(text: str) -> list[Hash]:
    parts = _split(text, "hashes")
    try:
        return [parse_hash(p) for p in parts]
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc


def _parse_tokens(text: str) -> list[int]:
    parts = _split(text, "tokens")
    try:
        return [int(p) for p in parts]
    except ValueError as exc:
        raise InvalidInput("tokens are comma-separated integers") from exc


class PrefixQuery(BaseModel):
    """A request as a KV-aware router sees it: its block hashes (hex, in
    order) or its token ids."""

    hashes: list[str] | None = Field(default=None, max_length=MAX_QUERY_ITEMS)
    tokens: list[int] | None = Field(default=None, max_length=MAX_QUERY_ITEMS)
    block_size: int | None = Field(default=None, ge=1, le=1 << 20)


router = APIRouter(prefix="/api", tags=["observer"])


@router.get("/health", summary="Liveness")
async def health(request: Request) -> dict[str, Any]:
    """``status`` is ``ok`` while every source's task runs and none is
    stale; ``degraded`` while one is restarting or dead (listed in ``down``)
    or stale -- it had data, then no connection and no message for
    ``silence_s`` (listed in ``stale``)."""
    fleet: Fleet = request.app.state.fleet
    sources = list(fleet.sources.values())
    down = {s.name: s.task_state for s in sources if not s.task_alive}
    now = time.time()
    stale = [s.name for s in sources if s.stale(now)]
    return {
        "status": "degraded" if down or stale else "ok",
        "role": "observer",
        "instances": len(sources),
        "connected": sum(1 for s in sources if s.connected),
        "exact": sum(1 for s in sources if s.exact(now)),
        "down": down,
        "stale": stale,
        "poison_messages": sum(s.poison.total for s in sources),
    }


@router.get("/fleet", dependencies=[Auth], summary="Every pool: stream health and map summary")
async def fleet_view(request: Request, fleet: FleetDep) -> dict[str, Any]:
    hub: FleetHub = request.app.state.hub
    return {
        "role": "observer",
        "seq": hub.seq,
        "started_at": fleet.started_at,
        "topic": request.app.state.settings.topic,
        "cannot_know": list(CANNOT_KNOW),
        "instances": [s.health() for s in fleet.sources.values()],
        "stream": hub.stats(),
    }


@router.get("/fleet/prefixes", dependencies=[Auth], summary="Who holds which prefixes")
async def prefixes(
    fleet: FleetDep,
    hash: Annotated[str | None, Query(max_length=20_000_000)] = None,  # noqa: A002
    tokens: Annotated[str | None, Query(max_length=20_000_000)] = None,
    block_size: Annotated[int | None, Query(ge=1, le=1 << 20)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 50,
) -> dict[str, Any]:
    """No query: prefix families (blocks grouped by their first block) with
    each pool's blocks and deepest chain.  ``hash=h`` (one block: the prefix
    it stands for) or ``hash=h1,h2,...`` (a request's hashes in order), or
    ``tokens=1,2,...``: each pool's leading cached blocks, best first."""
    if hash is not None and tokens is not None:
        raise InvalidInput("give hash or tokens, not both")
    if hash is not None:
        hashes = _parse_hashes(hash)
        if not hashes:
            raise InvalidInput("hash= needs at least one hash")
        return fleet.lookup(hashes=hashes)
    if tokens is not None:
        return fleet.lookup(tokens=_parse_tokens(tokens), block_size=block_size)
    return fleet.overview(limit)


@router.post("/fleet/prefixes", dependencies=[Auth], summary="Leading blocks per pool (body)")
async def prefixes_post(fleet: FleetDep, query: PrefixQuery) -> dict[str, Any]:
    if (query.hashes is None) == (query.tokens is None):
        raise InvalidInput("give exactly one of hashes or tokens")
    if query.hashes is not None:
        if not query.hashes:
            raise InvalidInput("hashes needs at least one hash")
        return fleet.lookup(hashes=_parse_hashes(",".join(query.hashes)))
    return fleet.lookup(tokens=query.tokens, block_size=query.block_size)


@router.get("/fleet/{instance}", dependencies=[Auth], summary="One pool's stream health")
async def instance_view(fleet: FleetDep, instance: str) -> dict[str, Any]:
    return _source(fleet, instance).health()


@router.get("/fleet/{instance}/hashmap", dependencies=[Auth], summary="One pool's hash map, paged")
async def hashmap(
    fleet: FleetDep,
    instance: str,
    offset: Annotated[int, Query(ge=0, le=1 << 31)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    q: Annotated[str | None, Query(max_length=128)] = None,
    multi_only: bool = False,
    sort: Annotated[str, Query(pattern="^(stored|copies|depth)$")] = "stored",
) -> dict[str, Any]:
    """``q`` matches the start of the hex hash, or of its decimal int form;
    ``multi_only`` keeps hashes held by several blocks; ``sort``: first stored
    (default), most copies, or deepest in its prefix."""
    s = _source(fleet, instance)
    state = s.state
    needle = q.strip().lower().removeprefix("0x") if q else None
    depths = state.depths() if sort == "depth" else None
    items: Any = state.entries.items()
    if sort == "copies":
        items = sorted(items, key=lambda kv: -kv[1].copies)
    elif depths is not None:
        items = sorted(items, key=lambda kv: -depths[kv[0]][1])
    out: list[dict[str, Any]] = []
    matched = 0
    for h, e in items:
        if multi_only and e.copies < 2:
            continue
        if needle and not (
            hash_hex(h).startswith(needle) or (isinstance(h, int) and str(h).startswith(needle))
        ):
            continue
        if matched >= offset and len(out) < limit:
            out.append(entry_json(h, e, depths[h][1] if depths is not None else None))
        matched += 1
    return {
        "instance": s.name,
        "exact": s.exact(time.time()),
        "total_keys": len(state.entries),
        "blocks": state.blocks,
        "matched": matched,
        "offset": offset,
        "limit": limit,
        "items": out,
    }


@router.get("/fleet/{instance}/snapshot", dependencies=[Auth], summary="One pool's whole map")
async def snapshot(
    fleet: FleetDep,
    instance: str,
    limit: Annotated[int, Query(ge=1, le=MAX_QUERY_ITEMS)] = MAX_QUERY_ITEMS,
) -> dict[str, Any]:
    """Every held hash (as ``/hashmap`` items, first stored first, at most 16
    token ids each) at one moment, with ``event_log_seq``: the last event of
    the pool's log (``/events``, the stream's per-instance ``seq``) it
    includes.  A client applies the stream's events for the pool from
    ``event_log_seq + 1`` on, and reads again when one is missing or
    ``state_resets`` (the map started over without an event) moves."""
    s = _source(fleet, instance)
    state = s.state
    items: list[dict[str, Any]] = []
    for h, e in state.entries.items():
        if len(items) >= limit:
            break
        item = entry_json(h, e)
        item["tokens"] = item["tokens"][:16]
        items.append(item)
    return {
        "instance": s.name,
        "exact": s.exact(time.time()),
        "event_log_seq": s.log.last_seq,
        "state_resets": s.resets,
        "max_keys": state.max_keys,
        "total_keys": len(state.entries),
        "blocks": state.blocks,
        "truncated": len(items) < len(state.entries),
        "items": items,
    }


@router.get("/fleet/{instance}/prefix-tree", dependencies=[Auth], summary="One pool's prefix tree")
async def prefix_tree(
    fleet: FleetDep,
    instance: str,
    limit: Annotated[int, Query(ge=1, le=200_000)] = 20_000,
) -> dict[str, Any]:
    """Held hashes with their parents (from BlockStored), roots first then
    breadth-first; ``orphan``: the parent is not held (evicted first, or
    stored before the observer joined)."""
    s = _source(fleet, instance)
    state = s.state
    children = state.children()
    nodes: list[dict[str, Any]] = []
    for h, depth in breadth_first(children, limit):
        e = state.entries[h]
        nodes.append(
            {
                "hash": hash_hex(h),
                "parent": None if e.parent is None else hash_hex(e.parent),
                "orphan": e.parent is not None and e.parent not in state.entries,
                "depth": depth,
                "copies": e.copies,
                "num_tokens": len(e.tokens),
                "tokens": list(e.tokens[:16]),
                "children": len(children.get(h, ())),
                "lora_name": e.lora_name,
            }
        )
    roots = len(children.get(None, ()))
    return {
        "instance": s.name,
        "exact": s.exact(time.time()),
        "total": len(state.entries),
        "roots": roots,
        "limit": limit,
        "truncated": len(nodes) < len(state.entries),
        "nodes": nodes,
    }


@router.get("/fleet/{instance}/events", dependencies=[Auth], summary="One pool's events since seq")
async def events(
    fleet: FleetDep,
    instance: str,
    since: Annotated[int, Query(ge=0, le=1 << 62)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    """``since`` and each item's ``seq`` count the events this observer
    applied for the pool (from 1); ``batch_seq`` is the publisher's sequence
    number of the batch the event came in."""
    s = _source(fleet, instance)
    entries, truncated = s.log.since(since, limit)
    return {
        "instance": s.name,
        "since": since,
        "last_seq": s.log.last_seq,
        "first_seq": s.log.first_seq,
        "truncated": truncated,
        "dropped_total": s.log.dropped,
        "next": entries[-1][0] if entries else since,
        "items": [event_json(seq, ts, item) for seq, ts, item in entries],
    }
