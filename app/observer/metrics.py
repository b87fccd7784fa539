"""The observer's ``/metrics``: per-pool stream health (label ``pool``) and
its websocket clients, read from the fleet at scrape time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.figures import totals
from app.observer.fleet import Fleet
from app.observer.hub import HUB_HELP, FleetHub


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
        now = time.time()
        yield fam("g", "exact", "1 when every batch since seq 0 (or a clear) was applied "
                  "and the publisher has not gone away (0 when stale).",
                  lambda s: s.exact(now))  # fmt: skip
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
        yield fam("g", "task_running", "1 while the source's task runs (0: restarting, dead).",
                  lambda s: s.task_alive)  # fmt: skip
        yield fam("c", "task_restarts", "Restarts of the source's task after a failure.",
                  lambda s: s.task_restarts)  # fmt: skip
        yield fam("c", "unknown_fields", "Event fields no known vLLM release sends (kept).",
                  lambda s: s.unknown_fields_total)  # fmt: skip
        groups = GaugeMetricFamily(
            p + "group_blocks", "Cached blocks per KV-cache group (group_idx; '-': none given).",
            labels=["pool", "group"],
        )  # fmt: skip
        for s in sources:
            for g, n in sorted(s.state.group_blocks.items(), key=lambda kv: str(kv[0])):
                groups.add_metric([s.name, "-" if g is None else str(g)], float(n))
        yield groups
        yield fam("c", "apply_errors", "Batches whose apply failed (state then inexact).",
                  lambda s: s.tracker.apply_errors)  # fmt: skip
        poison = CounterMetricFamily(
            p + "poison_messages", "Poison messages (or parts of them) refused, by kind.",
            labels=["pool", "kind"],
        )  # fmt: skip
        for s in sources:
            for kind, n in sorted(s.poison.counts.items()):
                poison.add_metric([s.name, kind], float(n))
        yield poison
        age = GaugeMetricFamily(
            p + "last_batch_age_seconds",
            "Seconds since the instance's last batch was applied (since the observer "
            "started when none yet): alert on a stalled publisher.",
            labels=["pool"],
        )
        for s in sources:
            age.add_metric([s.name], s.last_batch_age(now))
        yield age
        stale = GaugeMetricFamily(
            p + "stale",
            "1 when the pool's publisher went away: data came, then no connection and no "
            "message for silence_s (the map is the last one heard).",
            labels=["pool"],
        )
        for s in sources:
            stale.add_metric([s.name], float(s.stale(now)))
        yield stale
        yield fam("g", "hash_map_max_keys", "The cap on hashes held (--max-hashes).",
                  lambda s: s.state.max_keys or 0)  # fmt: skip
        yield fam("c", "hash_overflow_blocks", "Stored blocks not kept: over the held-hash cap.",
                  lambda s: s.state.overflow)  # fmt: skip
        yield fam("c", "live_duplicates", "Live messages received twice (skipped).",
                  lambda s: s.tracker.live_duplicates)  # fmt: skip
        yield fam("c", "replay_out_of_range", "Replayed seqs past the live stream (given up).",
                  lambda s: s.tracker.replay_out_of_range)  # fmt: skip
        hub = self.hub
        yield GaugeMetricFamily(p + "ws_clients", "Websocket clients.", value=len(hub.fan))
        yield CounterMetricFamily(
            p + "ws_clients_dropped", "Slow websocket clients resynced.", value=hub.counts.drops
        )
        for name, value in totals(hub.counts).items():
            if name != "drops_total":  # ws_clients_dropped_total
                short = name.removesuffix("_total")
                yield CounterMetricFamily(p + "ws_" + short, HUB_HELP[name], value=value)
