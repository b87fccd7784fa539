"""Prometheus ``/metrics``: read from the engine at scrape time.

A service of its own pool (``serve``, ``--demo``, a trace replay) says the
pool's figures under vLLM's names where the meaning matches (with vLLM's
``model_name`` and ``engine`` labels, so vLLM's Grafana KV-cache panels
work against it): no vLLM engine is beside it.

A mirror (``serve --mirror``) never does: scraped next to its engine, a
``vllm:`` series of its own would be summed into every query of vLLM's
dashboard (they aggregate by ``model_name`` across instances, so a label
of ours would not keep it apart).  It says the engine's figures as it
follows them under ``blockpool_engine_`` (``MIRROR_NAMES``), labelled as
vLLM labels them, so one PromQL ``on (model_name)`` joins the two; a figure
not known on the mirror is absent, never 0.  Ours are under ``blockpool_``
in both.  Base units, ``_total`` only on counters, never an id as a label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from app.analysis import prom as analysis_prom
from blockpool.runtime.columns import STATE_NAMES

if TYPE_CHECKING:
    from app.pool.engine import Engine

StatsSource = Callable[[], dict[str, float]]

# vLLM's name -> a mirror's (the engine's figure as the mirror follows it, or
# the mirror's own measure of the mirrored pool: the sampled block histograms)
MIRROR_NAMES = {
    "vllm:kv_cache_usage_perc": "blockpool_engine_kv_cache_usage_perc",
    "vllm:prefix_cache_queries": "blockpool_engine_prefix_cache_queries",
    "vllm:prefix_cache_hits": "blockpool_engine_prefix_cache_hits",
    "vllm:num_requests_running": "blockpool_engine_num_requests_running",
    "vllm:num_requests_waiting": "blockpool_engine_num_requests_waiting",
    "vllm:cache_config_info": "blockpool_engine_cache_config_info",
    "vllm:kv_block_lifetime_seconds": "blockpool_kv_block_lifetime_seconds",
    "vllm:kv_block_idle_before_evict_seconds": "blockpool_kv_block_idle_before_evict_seconds",
    "vllm:kv_block_reuse_gap_seconds": "blockpool_kv_block_reuse_gap_seconds",
}


class EngineCollector(Collector):
    def __init__(self, engine: Engine, extra: dict[str, StatsSource] | None = None) -> None:
        self.engine = engine
        # name -> source of our own gauges/counters from other parts (stream,
        # demo, publisher): {"stream": lambda: {"clients": 3, ...}}
        self.extra = extra if extra is not None else {}
        self.mirror = False  # a mirror's names (MIRROR_NAMES): set by app/mirror/setup.py

    def _name(self, vllm_name: str) -> str:
        return MIRROR_NAMES[vllm_name] if self.mirror else vllm_name

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        labels = ["model_name", "engine"]
        lv = [e.settings.model_name, "0"]
        own = self._name

        def gauge(vllm_name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(own(vllm_name), doc, labels=labels)
            g.add_metric(lv, value)
            return g

        def counter(vllm_name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(own(vllm_name), doc, labels=labels)
            c.add_metric(lv, value)
            return c

        stats = e.manager.stats
        c = e.counters
        reqs = e.request_counts()
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            e.pool.get_usage(),
        )  # fmt: skip
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.hits,
        )
        if reqs["running"] is not None:  # absent where not known (a mirror's: see below)
            yield gauge(
                "vllm:num_requests_running",
                "Number of requests running: on a mirror the engine's running queue; "
                "else admitted and holding blocks (every REST-admitted request, until "
                "finished).",
                reqs["running"],
            )
        if reqs["waiting"] is not None:
            yield gauge(
                "vllm:num_requests_waiting",
                "Number of requests waiting: on a mirror the engine's waiting queue; else "
                "arrived in the service's own workloads (demo, trace replay) and not "
                "admitted yet (too few free blocks: not_enough_blocks, or the workload's "
                "running limit). REST clients queue their own.",
                reqs["waiting"],
            )
        if self.mirror:
            yield GaugeMetricFamily(
                "blockpool_engine_requests_known",
                "1 while the engine's running and waiting requests are known on the mirror "
                "(0: it joined a busy engine or missed a batch; GET /api/pool/rates says why)",
                value=float(reqs["running"] is not None),
            )
        info = GaugeMetricFamily(
            own("vllm:cache_config_info"),
            "Information of the LLMEngine CacheConfig",
            labels=[
                "block_size", "num_gpu_blocks", "enable_prefix_caching",
                "prefix_caching_hash_algo", "kv_cache_metrics_sample", "engine", "model_name",
            ],
        )  # fmt: skip
        info.add_metric(
            [
                str(e.settings.block_size),
                str(e.pool.num_gpu_blocks),
                str(e.pool.enable_caching),
                e.settings.hash_fn,
                str(e.collector.sample_rate),
                "0",
                e.settings.model_name,
            ],
            1.0,
        )
        yield info
        for vllm_name, key, doc in (
            ("vllm:kv_block_lifetime_seconds", "lifetime",
             "Histogram of KV cache block lifetime from allocation to eviction. Sampled."),
            ("vllm:kv_block_idle_before_evict_seconds", "idle",
             "Histogram of idle time before KV cache block eviction. Sampled."),
            ("vllm:kv_block_reuse_gap_seconds", "reuse_gap",
             "Histogram of time gaps between consecutive KV cache block accesses. Sampled."),
        ):  # fmt: skip
            h = e.histograms[key]
            fam = HistogramMetricFamily(own(vllm_name), doc, labels=labels)
            fam.add_metric(
                lv,
                [(_le(b), float(n)) for b, n in h.cumulative()],
                sum_value=h.sum,
            )
            yield fam

        blocks = GaugeMetricFamily(
            "blockpool_blocks", "Blocks by state (in_use, cached = evictable, empty, null).",
            labels=["state"],
        )  # fmt: skip
        for i, name in enumerate(STATE_NAMES):
            blocks.add_metric([name], e.columns.counts[i])
        yield blocks
        yield GaugeMetricFamily(
            "blockpool_free_blocks", "Blocks in the free queue (cached + empty).",
            value=e.pool.get_num_free_blocks(),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "blockpool_hash_map_keys", "Keys in the prefix-cache hash map.",
            value=len(e.pool.cached_block_hash_to_block),
        )  # fmt: skip
        for name, doc, value in (
            ("blockpool_evictions", "Cached blocks evicted (BlockRemoved).", c.evictions),
            ("blockpool_blocks_allocated", "Blocks allocated.", c.blocks_allocated),
            ("blockpool_blocks_freed", "Block references dropped.", c.blocks_freed),
            ("blockpool_blocks_touched", "Block references taken on existing blocks.",
             c.blocks_touched),
            ("blockpool_blocks_cached", "Blocks entered into the prefix cache.", c.blocks_cached),
            ("blockpool_operations", "Operations applied by the engine.", c.ops),
            ("blockpool_operations_refused", "Operations refused (nothing changed).",
             c.ops_failed),
            ("blockpool_resets", "Prefix-cache resets done.", c.resets),
            ("blockpool_resets_refused", "Prefix-cache resets refused.", c.resets_refused),
            ("blockpool_event_log_dropped", "KV events dropped from the bounded log.",
             e.events.dropped),
            ("blockpool_event_log_lost_before_tick",
             "KV events pushed out of the bounded log before the tick that sends them "
             "to the stream and the ZMQ publisher (one operation emitting more than "
             "the log holds).", e.events_lost_to_ticks),
            ("blockpool_eviction_samples", "Eviction samples taken.", e.samples.last_seq),
        ):  # fmt: skip
            yield CounterMetricFamily(name, doc, value=value)
        for name, doc, key in (
            ("blockpool_requests_admitted",
             "Requests admitted (on a mirror: the engine's first schedulings).", "admitted"),
            ("blockpool_requests_refused", "Requests refused for lack of blocks.", "refused"),
            ("blockpool_requests_finished", "Requests finished.", "finished"),
        ):  # fmt: skip
            if reqs[key] is not None:  # absent where not known (a mirror's)
                yield CounterMetricFamily(name, doc, value=reqs[key])
        kv = CounterMetricFamily(
            "blockpool_kv_events", "KV events emitted, by type.", labels=["type"]
        )
        for name, n in sorted(c.events.items()):
            kv.add_metric([name], n)
        yield kv
        if "tokens" not in e.unknown:  # absent where not known (a mirror's)
            yield from analysis_prom.token_families(e.runtime)
        yield from analysis_prom.families(e.analysis)
        for part, source in self.extra.items():
            for key, reading in sorted(source().items()):
                full = f"blockpool_{part}_{key}"
                doc = getattr(source, "help", {}).get(key) or f"{part}: {key}"
                if key.endswith("_total"):
                    yield CounterMetricFamily(full[: -len("_total")], doc, value=reading)
                else:
                    yield GaugeMetricFamily(full, doc, value=reading)


def _le(bound: float) -> str:
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


def make_registry(
    engine: Engine, extra: dict[str, StatsSource]
) -> tuple[CollectorRegistry, EngineCollector]:
    registry = CollectorRegistry(auto_describe=False)
    collector = EngineCollector(engine, extra)
    registry.register(collector)
    return registry, collector
