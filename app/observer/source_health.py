"""One observed source's health as the views show it, and what an operator
should check when its stream stays silent.

ZeroMQ's PUB/SUB works only when exactly one side binds (listens) and the
other connects: vLLM binds a wildcard endpoint (``tcp://*:5557``) and
connects to a concrete one (``tcp://observer-host:5557``); ``blockpool
serve`` does the same under its default ``--kv-events-bind auto``; the
observer connects to its ENDPOINTs and binds its ``--bind`` ones.  Two
connecting sides never meet and nothing says so -- hence these hints, shown
on the fleet card once nothing has arrived for ``silence_s`` seconds.

A stream that had data and then went away (no connection, no message for
``silence_s``) is *stale*: its card says so, with ``stale_hint``.
"""

from __future__ import annotations

import time
from typing import Any

STALE_REASON = "stale: the publisher went away; the map is the last one heard"


def silence_hint(
    endpoint: str, topic: str, connected: bool, received: int, waited_s: float, silence_s: float,
    binds: bool = False,
) -> str | None:  # fmt: skip
    """None while the stream is fine (or too young to tell); otherwise one
    paragraph naming what to check."""
    if received or waited_s < silence_s:
        return None
    waited = f"nothing received in {waited_s:.0f} s"
    if not connected and binds:
        return (
            f"{waited}, and no publisher has connected to {endpoint}, which this observer "
            "binds (--bind). The publisher must connect here: give vLLM a concrete kv-events "
            "endpoint naming this host and port (tcp://<observer host>:<port>; a wildcard "
            "endpoint makes vLLM bind instead). Check the host and port, that the publisher "
            "is running, and any firewall between."
        )
    if not connected:
        return (
            f"{waited}, and the SUB socket never connected to {endpoint}. The observer "
            "connects, so the publisher must bind (listen) on that host:port: vLLM binds "
            "its 'endpoint' (tcp://*:5557); blockpool serve binds only a wildcard or ipc "
            "endpoint or with --kv-events-bind bind (under 'auto' a concrete host means it "
            "connects, and two connecting sides never meet). Check the endpoint's host and "
            "port, that the publisher is running, and any firewall between. A publisher "
            "given a concrete host connects: observe it with --bind on that host:port."
        )
    checks = []
    if topic:
        checks.append(f"the topic (the observer takes topics starting with {topic!r})")
    checks += [
        "that the publisher has KV events on (enable_kv_cache_events, prefix caching) and traffic",
        "that this endpoint is its PUB socket, not its replay (ROUTER) one",
    ]
    return f"{waited}, though the SUB socket is connected to {endpoint}. Check " + (
        "; ".join(checks) + "."
    )


def stale_hint(endpoint: str, binds: bool, silent_s: float) -> str:
    """What a stale card says: the map is the last one heard."""
    side = (
        f"no publisher is connected to {endpoint} (bound here)"
        if binds
        else f"the connection to {endpoint} is closed"
    )
    return (
        f"stale: no message for {silent_s:.0f} s and {side}. The publisher stopped or "
        "restarted, or the network between failed; the map shows what it last said and may "
        "no longer be the engine's. When it comes back its seq tells whether the map "
        "carries on (gaps replayed) or starts over."
    )


def source_health(s: Any) -> dict[str, Any]:
    # ``s``: a Source (source.py imports this module, so not the other way round)
    """What ``/api/fleet`` and the websocket show of one source."""
    t = s.tracker
    now = time.time()
    waited = now - (s.started_at or now)
    stale = s.stale(now)
    silent = s.silent_for(now)
    return {
        "name": s.name,
        "endpoint": s.spec.endpoint,
        "mode": "bind" if s.spec.bind else "connect",
        "dashboard_url": s.dashboard_url,
        "replay_endpoint": s.spec.replay_endpoint,
        "data_parallel_rank": s.spec.data_parallel_rank,
        "ranks_seen": sorted(s.ranks_seen),
        "connected": s.connected,
        "connects": s.connects,
        "disconnects": s.disconnects,
        # a stale map is the last one heard: complete, but maybe no longer exact
        "exact": t.exact and not stale,
        "complete": t.exact,
        "inexact_reason": t.reason if not t.exact else STALE_REASON if stale else None,
        "first_seq": t.first_seq,
        "last_seq": t.applied,
        "live_seq": t.live_last,
        "received": t.received,
        "batches": t.batches,
        "events": s.events_total,
        "duplicates": t.duplicates,
        "gaps": t.gaps,
        "missed": t.missed,
        "drops": t.missed,
        "replays": t.replays,
        "replay_batches": t.replay_batches,
        "replay_failures": t.replay_failures,
        "last_replay_failure": t.last_failure,
        "replaying": t.replaying,
        "replay_layouts": dict(s.replay_layouts),
        "pending": len(t.pending),
        "restarts": t.restarts,
        "decode_errors": t.decode_errors,
        "apply_errors": t.apply_errors,
        "bad_messages": s.bad_messages,
        "refused_messages": s.refused_messages,
        "refused_publishers": s.refused_publishers,
        "publisher_changes": s.publisher_changes,
        "max_message_bytes": s.max_batch_bytes,
        "poison": dict(s.poison.counts),
        "poison_total": s.poison.total,
        "task": "running" if s.task_alive else s.task_state,
        "task_restarts": s.task_restarts,
        "last_task_error": s.last_task_error,
        "silence_s": s.silence_s,
        "silence_hint": silence_hint(
            s.spec.endpoint,
            s.topic.decode("utf-8", "replace"),
            s.connected,
            t.received,
            waited,
            s.silence_s,
            s.spec.bind,
        ),
        "stale": stale,
        "stale_hint": stale_hint(s.spec.endpoint, s.spec.bind, silent or 0.0) if stale else None,
        "idle": s.idle(now),
        "silent_s": silent,
        "live_duplicates": t.live_duplicates,
        "replay_out_of_range": t.replay_out_of_range,
        "unknown_events": s.unknown_events,
        "malformed_events": s.malformed_events,
        "unknown_fields": dict(s.unknown_fields),
        "unknown_fields_total": s.unknown_fields_total,
        "encodings": dict(s.encodings),
        "last_batch_ts": s.last_batch_ts,
        "last_batch_age_s": None if s.last_batch_at is None else now - s.last_batch_at,
        "event_log_seq": s.log.last_seq,
        "state_resets": s.resets,
        **s.state.summary(),
    }
