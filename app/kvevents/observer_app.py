"""``blockpool observe``: a dashboard of real vLLM (or SGLang, or blockpool)
instances, rebuilt from their ZMQ KV-event streams alone.

REST (JSON; hashes as hex strings -- 16 digits for the 64-bit int form):

* ``GET /api/health``
* ``GET /api/fleet`` -- every pool's stream health and map summary
* ``GET /api/fleet/prefixes`` -- prefix families and who holds them; with
  ``hash=`` (one block: its whole prefix; several, comma-separated: a
  request's hashes in order) or ``tokens=``: each pool's leading blocks
  (also ``POST`` with a JSON body for long prompts)
* ``GET /api/fleet/{instance}/hashmap`` -- paged, searchable by hash prefix
* ``GET /api/fleet/{instance}/prefix-tree``
* ``GET /api/fleet/{instance}/events?since=`` -- the pool's event log
* ``WS  /api/fleet/stream`` -- one JSON message per tick (see docs/observer.md)
* ``GET /metrics`` -- Prometheus, per-pool stream health (label ``pool``)

With a token every route needs ``Authorization: Bearer <token>`` (the
websocket and the page may pass ``?token=``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field

from app.api import errors as api_errors
from app.errors import InvalidInput, NotFound, Unauthorized
from app.kvevents.decode import Hash, hash_hex, parse_hash
from app.kvevents.event_json import event_json
from app.kvevents.fleet import CANNOT_KNOW, Fleet
from app.kvevents.hub import FleetHub
from app.kvevents.source import Source
from app.kvevents.state import entry_json
from app.settings import ObserverSettings

logger = logging.getLogger("blockpool.observer")
FRONTEND = Path(__file__).resolve().parents[2] / "frontend"
MAX_QUERY_ITEMS = 1_000_000


def _token_ok(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.strip().encode(), token.encode())


def require_token(request: Request) -> None:
    token: str | None = request.app.state.settings.token
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() == "bearer" and _token_ok(given, token):
        return
    raise Unauthorized(
        "this observer needs 'Authorization: Bearer <token>'"
        if not header
        else "the bearer token is wrong"
    )


Auth = Depends(require_token)


def get_fleet(request: Request) -> Fleet:
    fleet: Fleet = request.app.state.fleet
    return fleet


FleetDep = Annotated[Fleet, Depends(get_fleet)]


def _source(fleet: Fleet, instance: str) -> Source:
    s = fleet.get(instance)
    if s is None:
        raise NotFound(f"no pool named {instance!r}", instance=instance, known=list(fleet.sources))
    return s


def _parse_hashes(text: str) -> list[Hash]:
    parts = [p for p in text.replace(" ", ",").split(",") if p]
    if len(parts) > MAX_QUERY_ITEMS:
        raise InvalidInput(f"at most {MAX_QUERY_ITEMS} hashes")
    try:
        return [parse_hash(p) for p in parts]
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc


def _parse_tokens(text: str) -> list[int]:
    parts = [p for p in text.replace(" ", ",").split(",") if p]
    if len(parts) > MAX_QUERY_ITEMS:
        raise InvalidInput(f"at most {MAX_QUERY_ITEMS} tokens")
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
    fleet: Fleet = request.app.state.fleet
    sources = list(fleet.sources.values())
    return {
        "status": "ok",
        "role": "observer",
        "instances": len(sources),
        "connected": sum(1 for s in sources if s.connected),
        "exact": sum(1 for s in sources if s.tracker.exact),
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
        "exact": s.tracker.exact,
        "total_keys": len(state.entries),
        "blocks": state.blocks,
        "matched": matched,
        "offset": offset,
        "limit": limit,
        "items": out,
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
    level: list[tuple[Hash, int]] = [(h, 1) for h in children.get(None, [])]
    roots = len(level)
    while level and len(nodes) < limit:
        nxt: list[tuple[Hash, int]] = []
        for h, depth in level:
            if len(nodes) >= limit:
                break
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
            nxt.extend((c, depth + 1) for c in children.get(h, ()))
        level = nxt
    return {
        "instance": s.name,
        "exact": s.tracker.exact,
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


class ObserverCollector(Collector):
    def __init__(self, fleet: Fleet, hub: FleetHub) -> None:
        self.fleet = fleet
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        sources = list(self.fleet.sources.values())
        p = "blockpool_observer_"

        def fam(kind: str, name: str, doc: str, value: Any) -> Metric:
            cls = CounterMetricFamily if kind == "c" else GaugeMetricFamily
            m = cls(p + name, doc, labels=["pool"])
            for s in sources:
                m.add_metric([s.name], float(value(s)))
            return m

        yield fam("g", "connected", "1 when the SUB socket is connected.", lambda s: s.connected)
        yield fam("g", "exact", "1 when every batch since seq 0 (or a clear) was applied.",
                  lambda s: s.tracker.exact)  # fmt: skip
        yield fam("g", "last_seq", "The last publisher seq applied (-1: none).",
                  lambda s: -1 if s.tracker.applied is None else s.tracker.applied)  # fmt: skip
        yield fam("g", "hash_map_keys", "Hashes held.", lambda s: len(s.state.entries))
        yield fam("g", "blocks", "Cached blocks (copies of held hashes).", lambda s: s.state.blocks)
        yield fam("g", "replay_pending_batches", "Live batches held during a replay.",
                  lambda s: len(s.tracker.pending))  # fmt: skip
        yield fam("c", "batches", "Batches applied.", lambda s: s.tracker.batches)
        yield fam("c", "events", "Events applied.", lambda s: s.events_total)
        yield fam("c", "messages_received", "Live messages received.",
                  lambda s: s.tracker.received)  # fmt: skip
        yield fam("c", "gaps", "Sequence gaps detected.", lambda s: s.tracker.gaps)
        yield fam("c", "missed_batches", "Batches lost (not recovered by replay).",
                  lambda s: s.tracker.missed)  # fmt: skip
        yield fam("c", "duplicate_batches", "Batches received twice (replay and live).",
                  lambda s: s.tracker.duplicates)  # fmt: skip
        yield fam("c", "replays", "Replay requests sent.", lambda s: s.tracker.replays)
        yield fam("c", "replay_batches", "Batches received by replay.",
                  lambda s: s.tracker.replay_batches)  # fmt: skip
        yield fam("c", "replay_failures", "Replays that failed or fell short.",
                  lambda s: s.tracker.replay_failures)  # fmt: skip
        yield fam("c", "restarts", "Publisher restarts seen (seq went back).",
                  lambda s: s.tracker.restarts)  # fmt: skip
        yield fam("c", "decode_errors", "Batches that could not be decoded.",
                  lambda s: s.tracker.decode_errors + s.bad_messages)  # fmt: skip
        yield fam("c", "unknown_events", "Events of unknown types (skipped).",
                  lambda s: s.unknown_events + s.malformed_events)  # fmt: skip
        yield fam("c", "unknown_removals", "BlockRemoved of hashes not held.",
                  lambda s: s.state.unknown_removals)  # fmt: skip
        yield fam("c", "disconnects", "Stream disconnections.", lambda s: s.disconnects)
        yield GaugeMetricFamily(p + "ws_clients", "Websocket clients.", value=len(self.hub.clients))
        yield CounterMetricFamily(
            p + "ws_clients_dropped", "Slow websocket clients resynced.",
            value=self.hub.clients_dropped,
        )  # fmt: skip


def create_observer_app(settings: ObserverSettings | None = None) -> FastAPI:
    settings = settings or ObserverSettings()
    sources = [
        Source(
            spec,
            topic=settings.topic,
            event_log_capacity=settings.event_log_capacity,
            replay_timeout=settings.replay_timeout_s,
            replay_backoff=settings.replay_backoff_s,
            bootstrap_replay=settings.bootstrap_replay,
            max_pending=settings.max_pending,
            rcvhwm=settings.rcvhwm,
        )
        for spec in settings.sources()
    ]
    fleet = Fleet(sources)
    hub = FleetHub(fleet, settings.tick_hz, settings.ws_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await fleet.start()
        await hub.start()
        try:
            yield
        finally:
            await hub.stop()
            await fleet.stop()

    app = FastAPI(
        title="blockpool observer",
        version="0.1.0",
        summary="A fleet of vLLM prefix caches, rebuilt from their ZMQ KV-event streams",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.fleet = fleet
    app.state.hub = hub
    api_errors.install(app)
    app.include_router(router)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ObserverCollector(fleet, hub))

    @app.get("/metrics", include_in_schema=False, dependencies=[Auth])
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.websocket("/api/fleet/stream")
    async def stream(ws: WebSocket) -> None:
        token = settings.token
        if token is not None:
            header = ws.headers.get("authorization", "")
            scheme, _, given = header.partition(" ")
            ok = (scheme.lower() == "bearer" and _token_ok(given, token)) or _token_ok(
                ws.query_params.get("token"), token
            )
            if not ok:  # accepted first, so that a browser sees the code
                await ws.accept()
                await ws.close(code=4401, reason="unauthorized")
                return
        await ws.accept()
        client = hub.add()
        try:
            await ws.send_text(_dumps(hub.hello()))
            receiver = asyncio.create_task(_drain_incoming(ws))
            try:
                while True:
                    getter = asyncio.create_task(client.queue.get())
                    done, _ = await asyncio.wait(
                        {getter, receiver}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if receiver in done:
                        getter.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await getter
                        return
                    await ws.send_text(getter.result())
            finally:
                receiver.cancel()
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect):
                    await receiver
        except (WebSocketDisconnect, RuntimeError):
            return
        finally:
            hub.remove(client)

    if FRONTEND.is_dir():
        app.mount("/static", StaticFiles(directory=FRONTEND), name="static")

        @app.get("/", include_in_schema=False)
        async def index() -> FileResponse:
            return FileResponse(FRONTEND / "fleet.html")

    return app


async def _drain_incoming(ws: WebSocket) -> None:
    """Read (and ignore) what the client sends, until it goes away."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return


def _dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), allow_nan=False)
