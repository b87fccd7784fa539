"""The observer's ``/metrics``: per-pool stream health (label ``pool``) and
its websocket clients, read from the fleet at scrape time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.observer.fleet import Fleet
from app.observer.hub import HUB_HELP, FleetHub
from app.observer.source import Source
from blockpool.common.figures import totals
from blockpool.kvevents.replay_frames import REPLAY_LAYOUTS

AGE_HELP = (
    "Seconds since the instance's last batch was applied (since the observer started "
    "when none yet): alert on a stalled publisher."
)
STALE_HELP = (
    "1 when the pool's publisher went away: data came, then no connection and no "
    "message for silence_s (the map is the last one heard)."
)
EXACT_HELP = (
    "1 when every batch since seq 0 (or a clear) was applied and the publisher has "
    "not gone away (0 when stale)."
)

M = TypeVar("M", GaugeMetricFamily, CounterMetricFamily)

# name -> (kind, HELP): "c" a counter (exported as NAME_total), "g" a gauge;
# one family each, label ``pool``, read by ``readings``
PER_POOL: dict[str, tuple[str, str]] = {
    "connected": ("g", "1 when the SUB socket is connected."),
    "exact": ("g", EXACT_HELP),
    "last_seq": ("g", "The last publisher seq applied (-1: none)."),
    "hash_map_keys": ("g", "Hashes held."),
    "blocks": ("g", "Cached blocks (copies of held hashes)."),
    "replay_pending_batches": ("g", "Live batches held during a replay."),
    "batches": ("c", "Batches applied."),
    "events": ("c", "Events applied."),
    "messages_received": ("c", "Live messages received."),
    "gaps": ("c", "Sequence gaps detected."),
    "missed_batches": ("c", "Batches lost (not recovered by replay)."),
    "duplicate_batches": ("c", "Batches received twice (replay and live)."),
    "replays": ("c", "Replay requests sent."),
    "replay_batches": ("c", "Batches received by replay."),
    "replay_failures": ("c", "Replays that failed or fell short."),
    "restarts": ("c", "Publisher restarts seen (seq went back)."),
    "decode_errors": ("c", "Batches that could not be decoded."),
    "unknown_events": ("c", "Events of unknown types (skipped)."),
    "unknown_removals": ("c", "BlockRemoved of hashes not held."),
    "disconnects": ("c", "Stream disconnections."),
    "task_running": ("g", "1 while the source's task runs (0: restarting, dead)."),
    "task_restarts": ("c", "Restarts of the source's task after a failure."),
    "unknown_fields": ("c", "Event fields no known vLLM release sends (kept)."),
    "apply_errors": ("c", "Batches whose apply failed (state then inexact)."),
    "hash_map_max_keys": ("g", "The cap on hashes held (--max-hashes)."),
    "hash_overflow_blocks": ("c", "Stored blocks not kept: over the held-hash cap."),
    "live_duplicates": ("c", "Live messages received twice (skipped)."),
    "replay_out_of_range": ("c", "Replayed seqs past the live stream (given up)."),
    "last_batch_age_seconds": ("g", AGE_HELP),
    "stale": ("g", STALE_HELP),
    "refused_messages": ("c", "Live messages of a second publisher connection (refused)."),
    "refused_publishers": ("c", "Second publisher connections whose messages were refused."),
    "publisher_changes": ("c", "A new connection took over after the publisher's closed."),
}


def readings(s: Source, now: float) -> dict[str, float]:
    """One source's figure for each family of ``PER_POOL``."""
    t, st = s.tracker, s.state
    return {
        "connected": s.connected,
        "exact": s.exact(now),
        "last_seq": -1 if t.applied is None else t.applied,
        "hash_map_keys": len(st.entries),
        "blocks": st.blocks,
        "replay_pending_batches": len(t.pending),
        "batches": t.batches,
        "events": s.events_total,
        "messages_received": t.received,
        "gaps": t.gaps,
        "missed_batches": t.missed,
        "duplicate_batches": t.duplicates,
        "replays": t.replays,
        "replay_batches": t.replay_batches,
        "replay_failures": t.replay_failures,
        "restarts": t.restarts,
        "decode_errors": t.decode_errors + s.bad_messages,
        "unknown_events": s.unknown_events + s.malformed_events,
        "unknown_removals": st.unknown_removals,
        "disconnects": s.disconnects,
        "task_running": s.task_alive,
        "task_restarts": s.task_restarts,
        "unknown_fields": s.unknown_fields_total,
        "apply_errors": t.apply_errors,
        "hash_map_max_keys": st.max_keys or 0,
        "hash_overflow_blocks": st.overflow,
        "live_duplicates": t.live_duplicates,
        "replay_out_of_range": t.replay_out_of_range,
        "last_batch_age_seconds": s.last_batch_age(now),
        "stale": s.stale(now),
        "refused_messages": s.refused_messages,
        "refused_publishers": s.refused_publishers,
        "publisher_changes": s.publisher_changes,
    }


def labelled(family: M, by_pool: dict[str, dict[str, int]]) -> M:
    """``family`` with a sample per pool and second label, in label order."""
    for pool, values in by_pool.items():
        for label, n in sorted(values.items()):
            family.add_metric([pool, label], float(n))
    return family


class ObserverCollector(Collector):
    def __init__(self, fleet: Fleet, hub: FleetHub) -> None:
        self.fleet = fleet
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        sources = list(self.fleet.sources.values())
        p = "blockpool_observer_"

        now = time.time()
        read = {s.name: readings(s, now) for s in sources}
        for name, (kind, doc) in PER_POOL.items():
            cls = CounterMetricFamily if kind == "c" else GaugeMetricFamily
            m = cls(p + name, doc, labels=["pool"])
            for s in sources:
                m.add_metric([s.name], float(read[s.name][name]))
            yield m
        yield labelled(
            GaugeMetricFamily(
                p + "group_blocks",
                "Cached blocks per KV-cache group (group_idx; '-': none given).",
                labels=["pool", "group"],
            ),
            {s.name: {("-" if g is None else str(g)): n for g, n in s.state.group_blocks.items()}
             for s in sources},
        )  # fmt: skip
        yield labelled(
            CounterMetricFamily(
                p + "poison_messages",
                "Poison messages (or parts of them) refused, by kind.",
                labels=["pool", "kind"],
            ),
            {s.name: s.poison.by_kind() for s in sources},
        )
        yield labelled(
            CounterMetricFamily(
                p + "replay_replies",
                "Replay replies read, by layout: v016 (vLLM 0.16's 3 frames), topic (vLLM "
                "0.24 on's 4).",
                labels=["pool", "layout"],
            ),
            {s.name: {k: s.replay_layouts.get(k, 0) for k in REPLAY_LAYOUTS} for s in sources},
        )
        hub = self.hub
        yield GaugeMetricFamily(p + "ws_clients", "Websocket clients.", value=len(hub.fan))
        yield CounterMetricFamily(
            p + "ws_clients_dropped", "Slow websocket clients resynced.", value=hub.counts.drops
        )
        for name, value in totals(hub.counts).items():
            if name != "drops_total":  # ws_clients_dropped_total
                short = name.removesuffix("_total")
                yield CounterMetricFamily(p + "ws_" + short, HUB_HELP[name], value=value)
