"""The observer's ``/metrics``: per-pool stream health (label ``pool``) and
its websocket clients, read from the fleet at scrape time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.figures import totals
from app.observer.fleet import Fleet
from app.observer.hub import HUB_HELP, FleetHub
from app.observer.source import Source

# (kind, name, HELP, reading of a source at a time): one family each, label ``pool``
PER_POOL: list[tuple[str, str, str, Callable[[Source, float], float]]] = [
    ("g", "connected", "1 when the SUB socket is connected.",
     lambda s, now: s.connected),
    ("g", "exact", "1 when every batch since seq 0 (or a clear) was applied "
     "and the publisher has not gone away (0 when stale).",
     lambda s, now: s.exact(now)),
    ("g", "last_seq", "The last publisher seq applied (-1: none).",
     lambda s, now: -1 if s.tracker.applied is None else s.tracker.applied),
    ("g", "hash_map_keys", "Hashes held.",
     lambda s, now: len(s.state.entries)),
    ("g", "blocks", "Cached blocks (copies of held hashes).",
     lambda s, now: s.state.blocks),
    ("g", "replay_pending_batches", "Live batches held during a replay.",
     lambda s, now: len(s.tracker.pending)),
    ("c", "batches", "Batches applied.",
     lambda s, now: s.tracker.batches),
    ("c", "events", "Events applied.",
     lambda s, now: s.events_total),
    ("c", "messages_received", "Live messages received.",
     lambda s, now: s.tracker.received),
    ("c", "gaps", "Sequence gaps detected.",
     lambda s, now: s.tracker.gaps),
    ("c", "missed_batches", "Batches lost (not recovered by replay).",
     lambda s, now: s.tracker.missed),
    ("c", "duplicate_batches", "Batches received twice (replay and live).",
     lambda s, now: s.tracker.duplicates),
    ("c", "replays", "Replay requests sent.",
     lambda s, now: s.tracker.replays),
    ("c", "replay_batches", "Batches received by replay.",
     lambda s, now: s.tracker.replay_batches),
    ("c", "replay_failures", "Replays that failed or fell short.",
     lambda s, now: s.tracker.replay_failures),
    ("c", "restarts", "Publisher restarts seen (seq went back).",
     lambda s, now: s.tracker.restarts),
    ("c", "decode_errors", "Batches that could not be decoded.",
     lambda s, now: s.tracker.decode_errors + s.bad_messages),
    ("c", "unknown_events", "Events of unknown types (skipped).",
     lambda s, now: s.unknown_events + s.malformed_events),
    ("c", "unknown_removals", "BlockRemoved of hashes not held.",
     lambda s, now: s.state.unknown_removals),
    ("c", "disconnects", "Stream disconnections.",
     lambda s, now: s.disconnects),
    ("g", "task_running", "1 while the source's task runs (0: restarting, dead).",
     lambda s, now: s.task_alive),
    ("c", "task_restarts", "Restarts of the source's task after a failure.",
     lambda s, now: s.task_restarts),
    ("c", "unknown_fields", "Event fields no known vLLM release sends (kept).",
     lambda s, now: s.unknown_fields_total),
    ("c", "apply_errors", "Batches whose apply failed (state then inexact).",
     lambda s, now: s.tracker.apply_errors),
    ("g", "hash_map_max_keys", "The cap on hashes held (--max-hashes).",
     lambda s, now: s.state.max_keys or 0),
    ("c", "hash_overflow_blocks", "Stored blocks not kept: over the held-hash cap.",
     lambda s, now: s.state.overflow),
    ("c", "live_duplicates", "Live messages received twice (skipped).",
     lambda s, now: s.tracker.live_duplicates),
    ("c", "replay_out_of_range", "Replayed seqs past the live stream (given up).",
     lambda s, now: s.tracker.replay_out_of_range),
    ("g", "last_batch_age_seconds", "Seconds since the instance's last batch was applied "
     "(since the observer started when none yet): alert on a stalled publisher.",
     lambda s, now: s.last_batch_age(now)),
    ("g", "stale", "1 when the pool's publisher went away: data came, "
     "then no connection and no message for silence_s (the map is the last one heard).",
     lambda s, now: s.stale(now)),
]  # fmt: skip


class ObserverCollector(Collector):
    def __init__(self, fleet: Fleet, hub: FleetHub) -> None:
        self.fleet = fleet
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        sources = list(self.fleet.sources.values())
        p = "blockpool_observer_"

        now = time.time()
        for kind, name, doc, read in PER_POOL:
            cls = CounterMetricFamily if kind == "c" else GaugeMetricFamily
            m = cls(p + name, doc, labels=["pool"])
            for s in sources:
                m.add_metric([s.name], float(read(s, now)))
            yield m
        groups = GaugeMetricFamily(
            p + "group_blocks", "Cached blocks per KV-cache group (group_idx; '-': none given).",
            labels=["pool", "group"],
        )  # fmt: skip
        for s in sources:
            for g, n in sorted(s.state.group_blocks.items(), key=lambda kv: str(kv[0])):
                groups.add_metric([s.name, "-" if g is None else str(g)], float(n))
        yield groups
        poison = CounterMetricFamily(
            p + "poison_messages", "Poison messages (or parts of them) refused, by kind.",
            labels=["pool", "kind"],
        )  # fmt: skip
        for s in sources:
            for kind, n in sorted(s.poison.counts.items()):
                poison.add_metric([s.name, kind], float(n))
        yield poison
        hub = self.hub
        yield GaugeMetricFamily(p + "ws_clients", "Websocket clients.", value=len(hub.fan))
        yield CounterMetricFamily(
            p + "ws_clients_dropped", "Slow websocket clients resynced.", value=hub.counts.drops
        )
        for name, value in totals(hub.counts).items():
            if name != "drops_total":  # ws_clients_dropped_total
                short = name.removesuffix("_total")
                yield CounterMetricFamily(p + "ws_" + short, HUB_HELP[name], value=value)
