"""Prometheus families of the analysis (read at scrape time).

Base units, ``_total`` only on counters (prometheus_client appends it), no
id as a label: reasons, causes, policies and capacity factors are bounded
sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString  # type: ignore[attr-defined]

from app.analysis import views
from app.analysis.common import Hist
from app.analysis.misses import CAUSES, REASONS

if TYPE_CHECKING:
    from app.engine import Engine


def _le(bound: float) -> str:
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


def _hist(name: str, doc: str, h: Hist) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc)
    fam.add_metric([], [(_le(b), float(n)) for b, n in h.cumulative()], sum_value=h.sum)
    return fam


def token_families(engine: Engine) -> Iterator[Metric]:
    t = views.tokens(engine)
    yield GaugeMetricFamily(
        "blockpool_token_usage_ratio",
        "Tokens held over the pool's token slots ((blocks - 1) x block_size); "
        "vllm:kv_cache_usage_perc counts whole blocks.",
        value=t["usage_ratio"],
    )
    yield GaugeMetricFamily(
        "blockpool_tokens_held", "Tokens held by blocks in use.", value=t["held"]
    )
    yield GaugeMetricFamily(
        "blockpool_token_slots_reserved",
        "Token slots of blocks in use (in-use blocks x block_size).",
        value=t["slots_reserved"],
    )
    yield GaugeMetricFamily(
        "blockpool_token_fill_ratio",
        "Tokens held over token slots reserved (partial tail blocks lower it).",
        value=t["fill_ratio"],
    )


def families(engine: Engine) -> Iterator[Metric]:
    an = engine.analysis
    if an is None:
        return
    m = an.misses
    misses = CounterMetricFamily(
        "blockpool_prefix_misses", "Prompt blocks that missed the prefix cache, by reason.",
        labels=["reason"],
    )  # fmt: skip
    tokens = CounterMetricFamily(
        "blockpool_prefix_miss_tokens", "Prompt tokens in blocks that missed, by reason.",
        labels=["reason"],
    )  # fmt: skip
    for code, name in enumerate(REASONS, start=1):
        misses.add_metric([name], m.blocks[code])
        tokens.add_metric([name], m.tokens[code])
    yield misses
    yield tokens
    yield CounterMetricFamily(
        "blockpool_prefix_hit_blocks", "Prompt blocks that hit the prefix cache.",
        value=m.blocks[0],
    )  # fmt: skip
    yield CounterMetricFamily(
        "blockpool_eviction_regrets",
        "Evicted hashes stored again (recomputed) while the eviction was remembered.",
        value=m.regrets,
    )
    yield _hist(
        "blockpool_eviction_regret_gap_seconds",
        "Seconds between a hash's eviction and its being stored again.",
        m.regret_gap,
    )
    causes = CounterMetricFamily(
        "blockpool_evictions_by_cause", "Cached hashes dropped, by cause.", labels=["cause"]
    )
    for cause, n in zip(CAUSES, m.evictions, strict=True):
        causes.add_metric([cause], n)
    yield causes
    yield _hist(
        "blockpool_eviction_queue_position",
        "Free-queue position (0 = head) of a block when it was freed, for blocks "
        "whose hash was later evicted by reuse.",
        m.ev_pos,
    )
    yield _hist(
        "blockpool_eviction_allocations_between",
        "Blocks allocated between a block's free and the eviction of its hash.",
        m.ev_allocs,
    )
    yield _hist(
        "blockpool_eviction_queue_seconds",
        "Seconds a block spent in the free queue before its hash was evicted by reuse.",
        m.ev_queue_s,
    )
    f = an.feeder
    if f is not None:
        labels = ["policy", "capacity_factor"]
        ratio = GaugeMetricFamily(
            "blockpool_shadow_hit_ratio",
            "Prefix-cache hit rate (tokens) of a shadow pool fed the same requests.",
            labels=labels,
        )
        queries = CounterMetricFamily(
            "blockpool_shadow_queries_tokens", "Tokens queried by a shadow pool.", labels=labels
        )
        hits = CounterMetricFamily(
            "blockpool_shadow_hits_tokens", "Tokens hit in a shadow pool.", labels=labels
        )
        cap = GaugeMetricFamily(
            "blockpool_shadow_capacity_blocks", "Blocks of a shadow pool.", labels=labels
        )
        for r in f.latest or []:
            lv = [r["policy"], f"{r['factor']:g}"]
            ratio.add_metric(lv, r["hit_rate"])
            queries.add_metric(lv, r["queries"] + r["refused_tokens"])
            hits.add_metric(lv, r["hits"])
            cap.add_metric(lv, r["capacity"])
        yield ratio
        yield queries
        yield hits
        yield cap
        yield GaugeMetricFamily(
            "blockpool_shadow_lag_accesses", "Accesses not yet applied by the shadows.",
            value=f.outstanding + len(f.pending),
        )  # fmt: skip
        yield CounterMetricFamily(
            "blockpool_shadow_dropped_accesses", "Accesses dropped (shadows restarted).",
            value=f.dropped,
        )  # fmt: skip
        yield CounterMetricFamily(
            "blockpool_shadow_resyncs", "Shadow restarts after falling behind.", value=f.resyncs
        )
    rec = an.recorder
    if rec is not None:
        yield GaugeMetricFamily(
            "blockpool_recording_ops", "Operations held by the recording.", value=rec.ops
        )
        yield GaugeMetricFamily(
            "blockpool_recording_bytes", "Encoded bytes held by the recording.", value=rec.nbytes
        )
        yield CounterMetricFamily(
            "blockpool_recording_dropped_ops", "Operations dropped from the bounded recording.",
            value=rec.dropped_ops,
        )  # fmt: skip
