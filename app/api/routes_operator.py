"""What an operator asks first: the hit rate as Grafana computes it, the
analysis' recent history (a page that just opened), one request's story."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from app.analysis.recent import RecentAnalysis
from app.api.costly import CostlyRead
from app.api.declare import route
from app.api.deps import EngineDep, ReadAuth
from app.pool import request_story
from app.pool.views import operator as r
from app.shared.errors import Conflict
from app.web.error_shape import ERROR_RESPONSES

router = APIRouter(prefix="/api", tags=["operator"], responses=ERROR_RESPONSES)

Rid = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]


@route(router.get, "/pool/rates", r.PoolRates, "Hit rate 1m / 5m, usage, requests", ReadAuth)
async def rates(engine: EngineDep) -> r.PoolRates:
    """The figures an operator compares with Grafana: the prefix hit rate over
    the last 1 and 5 minutes exactly as ``rate(vllm:prefix_cache_hits_total[1m])
    / rate(vllm:prefix_cache_queries_total[1m])`` computes it from samples of
    the two counters taken once a second, and since start (or the last
    prefix-cache reset, which restarts all three); usage as the 0-1 fraction
    of ``vllm:kv_cache_usage_perc``; running requests (holding blocks) and
    waiting ones (queued by the service's own workloads, not admitted yet)."""
    st = engine.manager.stats
    out: dict[str, Any] = engine.hit_window.summary(st.hits, st.queries)
    out["usage"] = float(engine.pool.get_usage())
    reqs = engine.request_counts()  # a mirror's: the engine's, or None with the reason
    out["requests_running"] = reqs["running"]
    out["requests_waiting"] = reqs["waiting"]
    out["requests_reason"] = reqs["reason"]
    return r.PoolRates(**out)


@route(router.get, "/analysis/recent", r.AnalysisRecent, "The analysis' recent history", ReadAuth)
async def analysis_recent(
    request: Request,
    engine: EngineDep,
    seconds: Annotated[float, Query(gt=0, le=3600)] = 300,
) -> dict[str, Any]:
    """The cumulative counters of the stream's ``analysis`` sections (misses
    by reason, hits, regrets, evictions) and the token usage, once a second
    over the last ``seconds``, oldest first: a page starts its charts here."""
    if engine.analysis is None:
        raise Conflict("the analysis is off (start the server with BLOCKPOOL_ANALYSIS=true)")
    recent: RecentAnalysis = request.app.state.analysis_recent
    return recent.view(seconds)


@route(
    router.get, "/requests/{request_id}/story", r.RequestStory, "One request's story", CostlyRead
)
async def story(
    engine: EngineDep,
    request: Request,
    request_id: Rid,
    limit: Annotated[int, Query(ge=2, le=10_000)] = 200,
) -> r.RequestStory:
    """Its blocks (ids per group), hits, misses with reasons, and when it was
    first tried, admitted, decoded and finished -- from the running request,
    the analysis (the last finished requests) and the recording, each bounded;
    ``sources`` says which answered.  404 when none knows the id.  On a
    mirror: the engine's request as its plugin told it (``sources.engine``)."""
    mirror = getattr(request.app.state, "mirror", None)
    if mirror is not None:
        return r.RequestStory(**mirror.story(request_id))
    return await request_story.story(engine, request_id, limit)
