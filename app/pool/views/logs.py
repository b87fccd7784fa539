"""The logs and the series: KV events, eviction samples with their
histograms, the time-series points."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired

from pydantic import Field, with_config
from typing_extensions import TypedDict

from app.pool.views.base import ITEM, Out
from blockpool import BlockRemoved, BlockStored, KVCacheEvent
from blockpool.common.keys import hash_hex

if TYPE_CHECKING:
    from app.pool.engine import Engine


@with_config(ITEM)
class Event(TypedDict):
    seq: int
    ts: float
    type: str
    block_hashes: NotRequired[list[str]]
    parent_block_hash: NotRequired[str | None]
    token_ids: NotRequired[list[int]]
    block_size: NotRequired[int]
    lora_id: NotRequired[int | None]
    lora_name: NotRequired[str | None]
    medium: NotRequired[str | None]


class Events(Out):
    """KV events after ``since`` (``truncated``: some were already dropped)."""

    since: int
    last_seq: int
    first_seq: int
    truncated: bool
    dropped_total: int
    next: int
    items: list[Event]


@with_config(ITEM)
class Histogram(TypedDict):
    buckets: Annotated[
        list[float | Literal["+Inf"]], Field(description="upper bounds, the last '+Inf'")
    ]
    cumulative_counts: list[int]
    sum: float
    count: int


class Samples(Out):
    """Eviction samples (residency) and their histograms."""

    since: int
    last_seq: int
    truncated: bool
    dropped_total: int
    next: int
    sample_rate: float
    items: list[dict[str, Any]]
    histograms: dict[str, Histogram]


class Series(Out):
    """Recent time-series points (one per tick)."""

    tick_hz: float
    points: list[dict[str, Any]]


def event_json(seq: int, ts: float, ev: KVCacheEvent) -> Event:
    out: Event = {"seq": seq, "ts": ts, "type": type(ev).__name__}
    if isinstance(ev, BlockStored):
        out["block_hashes"] = [hash_hex(h) for h in ev.block_hashes]
        parent = ev.parent_block_hash
        out["parent_block_hash"] = None if parent is None else hash_hex(parent)
        out["token_ids"] = ev.token_ids
        out["block_size"] = ev.block_size
        out["lora_id"] = ev.lora_id
        out["lora_name"] = ev.lora_name
        out["medium"] = ev.medium
    elif isinstance(ev, BlockRemoved):
        out["block_hashes"] = [hash_hex(h) for h in ev.block_hashes]
        out["medium"] = ev.medium
    return out


def events(engine: Engine, since: int, limit: int, types: set[str] | None) -> Events:
    entries, truncated = engine.events.since(since, limit)
    items = [event_json(seq, ts, ev) for seq, ts, ev in entries]
    if types:
        items = [e for e in items if e["type"] in types]
    return Events.model_construct(
        since=since,
        last_seq=engine.events.last_seq,
        first_seq=engine.events.first_seq,
        truncated=truncated,
        dropped_total=engine.events.dropped,
        next=entries[-1][0] if entries else since,
        items=items,
    )


def samples(engine: Engine, since: int, limit: int) -> Samples:
    entries, truncated = engine.samples.since(since, limit)
    histograms: dict[str, Histogram] = {
        name: {
            "buckets": [b if math.isfinite(b) else "+Inf" for b, _ in h.cumulative()],
            "cumulative_counts": [c for _, c in h.cumulative()],
            "sum": h.sum,
            "count": h.count,
        }
        for name, h in engine.histograms.items()
    }
    return Samples.model_construct(
        since=since,
        last_seq=engine.samples.last_seq,
        truncated=truncated,
        dropped_total=engine.samples.dropped,
        next=entries[-1][0] if entries else since,
        sample_rate=engine.collector.sample_rate,
        items=[
            {
                "seq": seq,
                "ts": ts,
                "lifetime_seconds": s.lifetime_seconds,
                "idle_seconds": s.idle_seconds,
                "reuse_gaps_seconds": list(s.reuse_gaps_seconds),
            }
            for seq, ts, s in entries
        ],
        histograms=histograms,
    )


def series(engine: Engine, limit: int) -> Series:
    pts = list(engine.series)[-limit:]
    return Series.model_construct(tick_hz=engine.settings.tick_hz, points=[_finite(p) for p in pts])


def _finite(p: dict[str, float]) -> dict[str, float | None]:
    return {k: (v if math.isfinite(v) else None) for k, v in p.items()}
