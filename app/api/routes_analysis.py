"""The operator's questions: why did it miss, what did eviction cost, what
would a bigger cache (or another free order) buy, what happened at 14:02."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, cast

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse

from app.analysis.host import AnalysisHost
from app.api.costly import CostlyExport, CostlyRead, charged_lines
from app.api.declare import AsBuilt, route
from app.api.deps import EngineDep, ReadAuth
from app.pool.engine import Engine
from app.pool.moment_tiles import moment_tiles
from app.pool.views import analysis as r
from app.shared.errors import Conflict, InvalidInput, NotFound
from app.web.error_shape import ERROR_RESPONSES
from blockpool.analysis import moments
from blockpool.analysis.export import export_lines
from blockpool.analysis.export_size import ExportSize
from blockpool.analysis.recording import History, Recorder
from blockpool.analysis.segment import EventsView
from blockpool.analysis.views import Misses

router = APIRouter(prefix="/api", tags=["analysis"], responses=ERROR_RESPONSES)

Limit = Annotated[int, Query(ge=1, le=10_000)]
Rid = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
Moment = Annotated[
    str,
    Query(
        min_length=1,
        max_length=64,
        description="an op seq, a Unix time (>= 1e9) or an ISO 8601 time",
        examples=["1200", "1764417720.5", "2026-11-29T14:02:00+00:00"],
    ),
]


def _analysis(engine: Engine) -> AnalysisHost:
    if engine.analysis is None:
        raise Conflict("the analysis is off (start the server with BLOCKPOOL_ANALYSIS=true)")
    return engine.analysis


def _recorder(engine: Engine) -> Recorder:
    an = _analysis(engine)
    if an.recorder is None:
        raise Conflict("the recording is off (start the server with BLOCKPOOL_RECORDING=true)")
    return an.recorder


@route(router.get, "/misses", Misses, "Why prefixes missed, in aggregate", ReadAuth)
async def misses(engine: EngineDep, limit: Limit = 50) -> AsBuilt[Misses]:
    """Missed prompt blocks (and tokens) by reason -- last_token,
    block_size_floor, cold, evicted, extra_keys, chain_broken, reset (and on
    a mirror, skipped) -- with how long ago evicted misses had been evicted
    and how far they had travelled through the free queue, every eviction's
    travel, and recent requests."""
    # blockpool.analysis.views.misses, ``worker`` set by the host (on a mirror,
    # the counts are the engine's requests': EngineMisses.view)
    return cast(Misses, await _analysis(engine).query("misses", limit=limit))


@route(
    router.get,
    "/misses/requests/{request_id}",
    r.RequestMisses,
    "One request's misses",
    ReadAuth,
)
async def request_misses(engine: EngineDep, request_id: Rid) -> AsBuilt[r.RequestMisses]:
    """Each prompt block: hit, or the reason it missed with its detail.
    Running requests and the most recently finished ones."""
    # blockpool.analysis.views.request_misses, ``worker`` added by the host
    return cast(r.RequestMisses, await _analysis(engine).query("request_misses", rid=request_id))


@route(router.get, "/regret", r.Regret, "Eviction regret", ReadAuth)
async def regret(engine: EngineDep, limit: Limit = 20) -> AsBuilt[r.Regret]:
    """Hashes stored again after their eviction: count, rate, gap histogram,
    the most regretted prefixes (by root block) and the latest regrets."""
    # blockpool.analysis.views.regret, ``worker`` added by the host
    out = cast(r.Regret, await _analysis(engine).query("regret", limit=limit))
    # null owner_request / last_request: why (a mirror's blocks come without requests)
    out["requests_reason"] = engine.unknown.get("request_owners")
    return out


@route(router.get, "/shadows", r.Shadows, "What-if: other sizes and policies", ReadAuth)
async def shadows(engine: EngineDep) -> dict[str, Any]:
    """The same request stream on shadow pools (metadata only) of other
    capacities and free orders: their hit rates, a miss-ratio curve per
    policy, and the real pool over the same span."""
    return await _analysis(engine).query("shadows")


# ------------------------------------------------------------------ history


@route(router.get, "/history", History, "The recording: span and keyframes", ReadAuth)
async def history(engine: EngineDep) -> AsBuilt[History]:
    return _recorder(engine).info()


def _lock(request: Request) -> asyncio.Lock:
    lock: asyncio.Lock | None = getattr(request.app.state, "history_lock", None)
    if lock is None:
        lock = request.app.state.history_lock = asyncio.Lock()
    return lock


def _seq(rec: Recorder, at: str, what: str) -> int:
    try:
        seq = moments.parse_moment(rec, at)
    except ValueError as exc:
        raise InvalidInput(f"{what}: {exc}", given=at) from None
    if rec.segment_for(seq) is None:
        raise NotFound(
            f"{what}: op seq {seq} is not held by the recording (held: {rec.first_seq}..{rec.seq})",
            seq=seq,
            first_seq=rec.first_seq,
            last_seq=rec.seq,
        )
    return seq


async def _moment(request: Request, engine: Engine, seq: int) -> moments.RebuiltMoment:
    rec = _recorder(engine)
    seg = rec.segment_for(seq)
    assert seg is not None
    entries = seg.entries(0, seq - seg.keyframe.seq)  # taken between operations
    async with _lock(request):
        return await asyncio.to_thread(moments.rebuild, seg.keyframe, entries, engine.config)


@route(
    router.get, "/history/state", moments.HistoryState, "The pool at a recorded moment", CostlyRead
)
async def history_state(
    request: Request,
    engine: EngineDep,
    at: Moment,
    limit: Annotated[int, Query(ge=1, le=1_000_000)] = 1000,
    include_blocks: bool = False,
) -> AsBuilt[moments.HistoryState]:
    """Rebuilt from the keyframe at or before the moment plus the operations
    after it: summary, the free queue (head first), the hash map, running
    requests; every block's state, ref count and hash with ``include_blocks``."""
    seq = _seq(_recorder(engine), at, "at")
    m = await _moment(request, engine, seq)
    out = moments.state_json(m, limit, include_blocks)
    ts = m.ts  # the moment's time
    usage = out["summary"]["usage"]
    out["tiles"] = tiles = moment_tiles(list(engine.series), ts, usage)
    past = engine.request_history  # a mirror's: the engine's requests then
    if past is not None:
        reqs = past.at(ts)
        out["summary"]["running_requests"] = reqs["running"]
        out["summary"]["waiting_requests"] = reqs["waiting"]
        out["summary"]["requests_reason"] = reqs["reason"]
        tiles["running"] = reqs["running"]
        tiles["running_reason"] = reqs["reason"]
    return out


@route(
    router.get, "/history/diff", moments.HistoryDiff, "What changed between two moments", CostlyRead
)
async def history_diff(
    request: Request,
    engine: EngineDep,
    from_: Annotated[str, Query(alias="from", min_length=1, max_length=64)],
    to: Moment,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> AsBuilt[moments.HistoryDiff]:
    """Hashes evicted and entered (with the block that held them), blocks
    whose ref count or hash changed, requests started and ended, operations
    and KV events in between."""
    rec = _recorder(engine)
    a = _seq(rec, from_, "from")
    b = _seq(rec, to, "to")
    if b < a:
        raise InvalidInput(f"'to' ({b}) is before 'from' ({a})", from_seq=a, to_seq=b)
    between = rec.entries_between(a, b)
    view = EventsView(engine.events)
    ma = await _moment(request, engine, a)
    mb = await _moment(request, engine, b)
    out = await asyncio.to_thread(moments.diff_json, ma, mb, between, view, limit)
    past = engine.request_history  # a mirror's: the engine's requests in between
    if past is not None:
        moved = past.between(ma.ts, mb.ts, limit)
        at_a, at_b = past.at(ma.ts), past.at(mb.ts)
        out["requests"] = {
            "started": moved["started"],
            "ended": moved["ended"],
            "running_from": at_a["running"],
            "running_to": at_b["running"],
            "reason": moved["reason"] or at_a["reason"] or at_b["reason"],
            "source": "engine",
        }
    return out


@route(router.get, "/history/export/size", ExportSize, "What the export would send now", ReadAuth)
async def history_export_size(engine: EngineDep) -> AsBuilt[ExportSize]:
    """The lines ``GET /history/export`` would send now, and its bytes
    estimated from the recording's counters (JSON bytes per recorded byte,
    sampled as the recording grows; a keyframe's size): O(1), nothing is
    written.  The JSON is many times the recording's in-memory size
    (``bytes_held``); the gzip export is a small fraction of it."""
    return _recorder(engine).export_size()


class NDJSONResponse(StreamingResponse):
    media_type = "application/x-ndjson"


GZIP_CHUNK = 1 << 16


def gzip_stream(lines: Iterable[str]) -> Iterator[bytes]:
    """The lines gzip-compressed, in chunks of about GZIP_CHUNK input bytes."""
    co = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    buf: list[bytes] = []
    size = 0
    for line in lines:
        b = line.encode()
        buf.append(b)
        size += len(b)
        if size >= GZIP_CHUNK:
            out = co.compress(b"".join(buf))
            buf, size = [], 0
            if out:
                yield out
    yield co.compress(b"".join(buf)) + co.flush()


def accepts_gzip(request: Request) -> bool:
    """Whether Accept-Encoding names gzip (or *) with a q above 0."""
    for part in request.headers.get("accept-encoding", "").split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() not in ("gzip", "*"):
            continue
        q = params.strip()
        if q.startswith("q="):
            try:
                if float(q[2:]) <= 0:
                    continue
            except ValueError:
                continue
        return True
    return False


@router.get(
    "/history/export",
    dependencies=[CostlyExport],
    summary="The recording as JSON lines",
    response_class=NDJSONResponse,
    responses={200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}}}},
)
async def history_export(request: Request, engine: EngineDep) -> StreamingResponse:
    """A header, every keyframe and operation (result and events included)
    from the oldest held, and the state now as a final keyframe.  Replay it
    with ``blockpool replay FILE``.  Gzip-compressed (``Content-Encoding:
    gzip``) when the request's ``Accept-Encoding`` allows it."""
    rec = _recorder(engine)
    header, segments, final, view = rec.export_parts()
    mirrored = rec.export_requests()  # a mirror's engine requests (none elsewhere)
    name = f"blockpool-recording-{int(time.time())}.jsonl"
    lines = charged_lines(request, export_lines(header, segments, final, view, mirrored))
    disposition = {
        "Content-Disposition": f'attachment; filename="{name}"',
        "Vary": "Accept-Encoding",
    }
    if accepts_gzip(request):
        return NDJSONResponse(
            gzip_stream(lines), headers={**disposition, "Content-Encoding": "gzip"}
        )
    return NDJSONResponse(lines, headers=disposition)


@router.get(
    "/history/export.jsonl.gz",
    dependencies=[CostlyExport],
    summary="The recording as gzip-compressed JSON lines (a file)",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/gzip": {"schema": {"type": "string"}}}}},
)
async def history_export_gz(request: Request, engine: EngineDep) -> StreamingResponse:
    """The same lines as ``GET /history/export``, as a ``.jsonl.gz`` file
    (``blockpool replay`` reads it as it is)."""
    rec = _recorder(engine)
    header, segments, final, view = rec.export_parts()
    mirrored = rec.export_requests()
    name = f"blockpool-recording-{int(time.time())}.jsonl.gz"
    return StreamingResponse(
        gzip_stream(charged_lines(request, export_lines(header, segments, final, view, mirrored))),
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
