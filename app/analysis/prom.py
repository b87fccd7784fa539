"""Prometheus families of the analysis (read at scrape time).

Base units, ``_total`` only on counters (prometheus_client appends it), no
id as a label: reasons, causes, policies and capacity factors are bounded
sets.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from blockpool.analysis import views
from blockpool.common.histogram import BucketHistogram as Hist
from blockpool.common.miss_reasons import CAUSES, REASONS

if TYPE_CHECKING:
    from blockpool.analysis.core import Analysis
    from blockpool.analysis.recording import Recorder
    from blockpool.runtime.runtime import PoolRuntime


class Host(Protocol):
    """What the families read of the service's analysis (app/analysis/host.py)."""

    remote: Any
    recorder: Recorder | None

    def prom_state(self) -> dict[str, Any] | None: ...


def _le(bound: float) -> str:
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


def _hist(name: str, doc: str, h: tuple[list[float], list[int], float]) -> HistogramMetricFamily:
    buckets, counts, total = h
    fam = HistogramMetricFamily(name, doc)
    acc, rows = 0, []
    for bound, c in zip([*buckets, math.inf], counts, strict=True):
        acc += c
        rows.append((_le(bound), float(acc)))
    fam.add_metric([], rows, sum_value=total)
    return fam


def _h(h: Hist) -> tuple[list[float], list[int], float]:
    return (list(h.buckets), list(h.counts), h.sum)


def _row(r: dict[str, Any]) -> tuple[Any, ...]:
    queried = r["queries"] + r["refused_tokens"]
    return (r["policy"], r["factor"], r["hit_rate"], queried, r["hits"], r["capacity"])


def state(an: Analysis) -> dict[str, Any]:
    """The figures behind the families (plain data: the worker sends them)."""
    m = an.misses
    f = an.feeder
    return {
        "blocks": list(m.blocks),
        "tokens": list(m.tokens),
        "regrets": m.regret.regrets,
        "regret_gap": _h(m.regret.regret_gap),
        "evictions": list(m.ring.evictions),
        "ev_pos": _h(m.ring.ev_pos),
        "ev_allocs": _h(m.ring.ev_allocs),
        "ev_queue_s": _h(m.ring.ev_queue_s),
        "shadows": None if f is None else [_row(r) for r in f.latest or []],
        "shadow": (
            {"lag": f.outstanding + len(f.pending), "dropped": f.dropped, "resyncs": f.resyncs}
            if f is not None
            else None
        ),
    }


def token_families(engine: PoolRuntime) -> Iterator[Metric]:
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


def families(an: Host | None) -> Iterator[Metric]:
    if an is None:
        return
    st = an.prom_state()
    if st is not None:
        yield from _analysis_families(st)
    if an.remote is not None:
        r = an.remote.snapshot()
        yield GaugeMetricFamily(
            "blockpool_analysis_lag_ops",
            "Recorded operations the analysis worker has not applied yet.",
            value=r["lag_ops"],
        )
        yield CounterMetricFamily(
            "blockpool_analysis_resyncs", "Analysis replica restarts after falling behind.",
            value=r["resyncs"],
        )  # fmt: skip
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


def _analysis_families(st: dict[str, Any]) -> Iterator[Metric]:
    misses = CounterMetricFamily(
        "blockpool_prefix_misses", "Prompt blocks that missed the prefix cache, by reason.",
        labels=["reason"],
    )  # fmt: skip
    tokens = CounterMetricFamily(
        "blockpool_prefix_miss_tokens", "Prompt tokens in blocks that missed, by reason.",
        labels=["reason"],
    )  # fmt: skip
    for code, name in enumerate(REASONS, start=1):
        misses.add_metric([name], st["blocks"][code])
        tokens.add_metric([name], st["tokens"][code])
    yield misses
    yield tokens
    yield CounterMetricFamily(
        "blockpool_prefix_hit_blocks", "Prompt blocks that hit the prefix cache.",
        value=st["blocks"][0],
    )  # fmt: skip
    yield CounterMetricFamily(
        "blockpool_eviction_regrets",
        "Evicted hashes stored again (recomputed) while the eviction was remembered.",
        value=st["regrets"],
    )
    yield _hist(
        "blockpool_eviction_regret_gap_seconds",
        "Seconds between a hash's eviction and its being stored again.",
        st["regret_gap"],
    )
    causes = CounterMetricFamily(
        "blockpool_evictions_by_cause", "Cached hashes dropped, by cause.", labels=["cause"]
    )
    for cause, n in zip(CAUSES, st["evictions"], strict=True):
        causes.add_metric([cause], n)
    yield causes
    yield _hist(
        "blockpool_eviction_queue_position",
        "Free-queue position (0 = head) of a block when it was freed, for blocks "
        "whose hash was later evicted by reuse.",
        st["ev_pos"],
    )
    yield _hist(
        "blockpool_eviction_allocations_between",
        "Blocks allocated between a block's free and the eviction of its hash.",
        st["ev_allocs"],
    )
    yield _hist(
        "blockpool_eviction_queue_seconds",
        "Seconds a block spent in the free queue before its hash was evicted by reuse.",
        st["ev_queue_s"],
    )
    rows = st.get("shadows")
    if rows is None:
        return
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
    for policy, factor, hit_rate, q, h, capacity in rows:
        lv = [policy, f"{factor:g}"]
        ratio.add_metric(lv, hit_rate)
        queries.add_metric(lv, q)
        hits.add_metric(lv, h)
        cap.add_metric(lv, capacity)
    yield ratio
    yield queries
    yield hits
    yield cap
    sh = st.get("shadow")
    if sh is not None:
        yield GaugeMetricFamily(
            "blockpool_shadow_lag_accesses", "Accesses not yet applied by the shadows.",
            value=sh["lag"],
        )  # fmt: skip
        yield CounterMetricFamily(
            "blockpool_shadow_dropped_accesses", "Accesses dropped (shadows restarted).",
            value=sh["dropped"],
        )  # fmt: skip
        yield CounterMetricFamily(
            "blockpool_shadow_resyncs", "Shadow restarts after falling behind.",
            value=sh["resyncs"],
        )  # fmt: skip
