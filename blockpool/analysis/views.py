"""JSON views of the analysis (REST, the stream's ``analysis`` section).

Each runs between two operations of the runtime: a consistent picture
of one moment.  Shadow figures are the worker's latest report (a tick or so
behind; ``lag_accesses`` says how far).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from blockpool.analysis.common import hex64
from blockpool.common.miss_reasons import (
    CAUSES,
    CODE_NAMES,
    REASONS,
    RequestMissCodes,
    evicted_count,
)
from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.errors import NotFound

if TYPE_CHECKING:
    from blockpool.analysis.core import Analysis
    from blockpool.runtime.runtime import PoolRuntime


def tokens(engine: PoolRuntime, unknown: str | None = None) -> dict[str, Any]:
    """Token-level usage beside block-level usage: a request's partial tail
    block reserves ``block_size`` slots but holds fewer tokens.  Blocks held
    only through the raw block API count as full (their fill is unknown).
    ``unknown``: why the pool's fill cannot be known at all (a mirror's pool
    is told blocks, never tokens): the token figures are None, ``reason``
    says it (slots reserved and the capacity are blocks x block size)."""
    bs = engine.config.block_size
    in_use = engine.columns.counts[1]
    reserved = in_use * bs
    held = reserved - engine.tail_waste
    capacity = (engine.pool.num_gpu_blocks - 1) * bs
    if unknown is not None:
        return {
            "held": None,
            "slots_reserved": reserved,
            "tail_waste": None,
            "capacity": capacity,
            "usage_ratio": None,
            "fill_ratio": None,
            "reason": unknown,
        }
    return {
        "held": held,
        "slots_reserved": reserved,
        "tail_waste": engine.tail_waste,
        "capacity": capacity,
        "usage_ratio": held / capacity if capacity else 0.0,
        "fill_ratio": held / reserved if reserved else 1.0,
        "reason": None,
    }


@shape
class RequestMissSummary(TypedDict):
    """One request's prompt blocks: how many hit, the misses by reason."""

    request_id: str
    admitted_at: float
    finished: bool
    num_prompt_tokens: int
    num_prompt_blocks: int
    num_hit_blocks: int
    misses: dict[str, int]


@shape
class RequestMissesView(RequestMissSummary):
    """What ``request_misses`` builds: the summary and each prompt block,
    hit or the reason it missed (the service's ``RequestMisses`` adds
    ``worker``, app/pool/views/analysis.py)."""

    finished_at: float | None
    lora_name: str | None
    cache_salt: str | None
    blocks: list[dict[str, Any]]


@shape
class RegretView(TypedDict):
    """What ``regret`` builds (the service's ``Regret`` adds ``worker`` and
    ``requests_reason``, app/pool/views/analysis.py)."""

    regrets_total: int
    evictions_total: int
    regret_ratio: float | None
    regrets_per_s: float
    evictions_per_s: float
    window_seconds: float
    gap_seconds: dict[str, Any]
    top_prefixes: list[dict[str, Any]]
    recent: list[dict[str, Any]]


@shape
class MissCounts(TypedDict):
    """Blocks (and tokens) hit and missed, by reason: what a mirror's
    ``EngineMisses.view`` says of the engine's requests too."""

    admissions: int
    hit: dict[str, int]
    missed: dict[str, int]
    reasons: dict[str, dict[str, float]]
    evicted_misses: dict[str, Any]


@shape
class Misses(MissCounts):
    """Why prefixes missed, by reason, with evicted-miss and floor histograms."""

    floor: dict[str, Any]
    evictions: dict[str, Any]
    recent_requests: list[Mapping[str, Any]]
    indexes: dict[str, Any]
    """what the miss indexes hold"""
    worker: dict[str, Any] | None
    """the analysis worker's lag (worker mode)"""


def _rm_summary(rm: RequestMissCodes) -> RequestMissSummary:
    return {
        "request_id": rm.request_id,
        "admitted_at": rm.ts,
        "finished": rm.finished_ts is not None,
        "num_prompt_tokens": rm.num_tokens,
        "num_prompt_blocks": len(rm.codes),
        "num_hit_blocks": rm.num_hit_blocks,
        "misses": rm.counts(),
    }


def misses(an: Analysis, limit: int) -> Misses:
    m = an.misses
    missed_blocks = sum(m.blocks[1:])
    reasons = {
        name: {
            "blocks": m.blocks[code],
            "tokens": m.tokens[code],
            "share": m.blocks[code] / missed_blocks if missed_blocks else 0.0,
        }
        for code, name in enumerate(REASONS, start=1)
    }
    recent = list(m.running.values())[-limit:] + list(m.finished.values())[-limit:]
    recent.sort(key=lambda r: r.ts, reverse=True)
    return {
        "admissions": m.admissions,
        "hit": {"blocks": m.blocks[0], "tokens": m.tokens[0]},
        "missed": {"blocks": missed_blocks, "tokens": sum(m.tokens[1:])},
        "reasons": reasons,
        "evicted_misses": {
            "ago_seconds": m.ago.as_json(),
            "queue_position_when_freed": m.miss_pos.as_json(),
            "allocations_between": m.miss_allocs.as_json(),
        },
        "floor": {"shared_tokens": m.floor_shared.as_json()},
        "evictions": {
            "by_cause": dict(zip(CAUSES, m.ring.evictions, strict=True)),
            "queue_position_when_freed": m.ring.ev_pos.as_json(),
            "allocations_between": m.ring.ev_allocs.as_json(),
            "seconds_in_queue": m.ring.ev_queue_s.as_json(),
        },
        "indexes": {
            "evicted_remembered": m.ring.evicted_remembered(),
            "evicted_capacity": m.size,
            "requests_running": len(m.running),
            "requests_finished_kept": len(m.finished),
            "finished_capacity": m.finished_kept,
        },
        "recent_requests": [_rm_summary(r) for r in recent[:limit]],
        "worker": None,  # the service's: its analysis worker's lag
    }


def request_misses(an: Analysis, rid: str) -> RequestMissesView:
    m = an.misses
    rm = m.lookup(rid)
    if rm is None:
        raise NotFound(
            f"no miss reasons for request {rid!r} (not admitted, or finished longer ago "
            f"than the last {m.finished_kept} requests)",
            request_id=rid,
        )
    bs = an.bs
    n = rm.num_tokens
    blocks = []
    for i, (reason, detail) in enumerate(m.block_reasons(rm)):
        blocks.append(
            {
                "index": i,
                "tokens": min(bs, n - i * bs),
                "hit": reason is None,
                "reason": reason,
                "detail": detail,
            }
        )
    return {
        **_rm_summary(rm),
        "finished_at": rm.finished_ts,
        "lora_name": rm.lora_name,
        "cache_salt": rm.cache_salt,
        "blocks": blocks,
    }


def block_reasons(an: Analysis, rid: str) -> list[tuple[str | None, dict[str, Any] | None]]:
    """Reason per prompt block of a request ([] when unknown)."""
    rm = an.misses.lookup(rid)
    return an.misses.block_reasons(rm) if rm is not None else []


def pack_reasons(an: Analysis, rid: str) -> tuple[bytes, dict[int, Any]] | None:
    """A request's reasons as the worker sends them: the codes, and the
    details of the blocks that have one (evictions resolved)."""
    rm = an.misses.lookup(rid)
    if rm is None:
        return None
    det = {i: d for i, (_, d) in enumerate(an.misses.block_reasons(rm)) if d is not None}
    return rm.codes, det


def unpack_reasons(
    packed: tuple[bytes, dict[int, Any]],
) -> list[tuple[str | None, dict[str, Any] | None]]:
    codes, det = packed
    return [(CODE_NAMES[c], det.get(i)) for i, c in enumerate(codes)]


def regret(an: Analysis, limit: int) -> RegretView:
    m = an.misses.regret
    total_ev = evicted_count(an.misses.ring.evictions)
    rates = an.rates()
    top = [
        {
            "root": hex64(r.root),
            "regrets": r.regrets,
            "mean_gap_seconds": r.gap_sum / r.regrets if r.regrets else None,
            "last_gap_seconds": r.last_gap,
            "last_at": r.last_ts,
            "deepest_block": r.max_depth,
            "last_request": r.last_victim,
            "owner_request": r.last_owner,
            "first_tokens": r.first_tokens,
            "lora_name": r.lora_name,
            "cache_salt": r.cache_salt,
        }
        for r in m.top_roots(limit)
    ]
    return {
        "regrets_total": m.regrets,
        "evictions_total": total_ev,
        "regret_ratio": m.regrets / total_ev if total_ev else 0.0,
        "regrets_per_s": rates["regrets_per_s"],
        "evictions_per_s": rates["evictions_per_s"],
        "window_seconds": rates["window_s"],
        "gap_seconds": m.regret_gap.as_json(),
        "top_prefixes": top,
        "recent": m.recent_regret_rows(limit),
    }


def shadows(an: Analysis) -> dict[str, Any]:
    engine = an.rt
    return shadows_of(an.feeder, engine.pool.num_gpu_blocks - 1, engine.manager.stats)


def shadows_of(f: Any, capacity: int, st: Any) -> dict[str, Any]:
    """What the shadows fed by ``f`` (None: none) say, beside the real pool
    of ``capacity`` usable blocks and prefix-cache counters ``st``."""
    out: dict[str, Any] = {
        "enabled": f is not None,
        "real": {
            "capacity": capacity,
            "queries_tokens": st.queries,
            "hits_tokens": st.hits,
            "hit_rate": st.hit_rate,
        },
        "shadows": [],
        "curve": {},
    }
    if f is None:
        return out
    out.update(f.snapshot())
    real = f.latest_real
    if real is not None:  # the real pool over the span the shadows saw
        q = real[0] - f.real_base[0]
        h = real[1] - f.real_base[1]
        out["real"]["span"] = {
            "queries_tokens": q,
            "hits_tokens": h,
            "hit_rate": h / q if q else 0.0,
        }
    rows = f.latest or []
    out["shadows"] = rows
    curve: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        curve.setdefault(r["policy"], []).append(
            {"factor": r["factor"], "capacity": r["capacity"], "hit_rate": r["hit_rate"]}
        )
    for pts in curve.values():
        pts.sort(key=lambda p: p["factor"])
    out["curve"] = curve
    return out


def stream_section(an: Analysis) -> dict[str, Any]:
    """The stream's ``analysis`` header section (small: sent about once a second)."""
    m = an.misses
    rates = an.rates()
    f = an.feeder
    sh = shadow_rows(f)
    return {
        "ts": time.time(),
        "misses": {name: m.blocks[code] for code, name in enumerate(REASONS, start=1)},
        "miss_tokens": {name: m.tokens[code] for code, name in enumerate(REASONS, start=1)},
        "hit_blocks": m.blocks[0],
        "regrets": m.regret.regrets,
        "evictions": evicted_count(m.ring.evictions),
        "regrets_per_s": _finite(rates["regrets_per_s"]),
        "evictions_per_s": _finite(rates["evictions_per_s"]),
        "regret_gap_p50": _finite(m.regret.regret_gap.quantile(0.5)),
        "regret_gap_p90": _finite(m.regret.regret_gap.quantile(0.9)),
        "shadows": sh,
        "shadow_lag": (f.outstanding + len(f.pending)) if f is not None else None,
        "shadow_error": f.error if f is not None else None,
        "recording": (
            {"first_seq": an.recorder.first_seq, "last_seq": an.recorder.seq}
            if an.recorder is not None
            else None
        ),
    }


def shadow_rows(f: Any) -> list[list[Any]]:
    """The stream's compact rows of the shadows fed by ``f`` (None: none)."""
    if f is None:
        return []
    return [
        [
            r["name"],
            r["policy"],
            r["factor"],
            r["capacity"],
            _finite(r["hit_rate"]),
            r["queries"],
            r["hits"],
            r["evictions"],
        ]
        for r in f.latest or []
    ]


def _finite(v: float | None) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return v


# The views a service may ask for by name (REST, the analysis worker).
VIEWS: dict[str, Any] = {
    "misses": misses,
    "request_misses": request_misses,
    "regret": regret,
    "shadows": shadows,
}
