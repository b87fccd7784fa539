"""What ``GET /api/mirror`` reports: the mirror's health, counted.

``exact`` is worked out when it is read, never stored: the runtime was put
in the engine's state (a snapshot), at least one digest of the engine's
matched the mirror's since, the engine is not silent (``stale``), the mirror
is not ``behind`` (its oldest message not yet applied is older than the lag
bound), and nothing it cannot follow was announced.  The live stream's
``mirror`` header and ``/metrics`` read the same ``view``, so the three
agree.

An engine restarted as another pool (``shape_problem``) is ``rebuilding``:
``serve`` builds the service again from its handshake (the new service's
status counts it in ``rebuilds``); ``restart_needed`` only where no rebuild
can follow it (a service built without one, or a handshake of the shape the
service was built from).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from blockpool.common.figures import Figures
from blockpool.mirror.protocol import DigestReading, Hello

STALE_AFTER_S = 3.0  # no message (batch, beat or hello) for this long: stale
REFUSED_WHY = (
    "a message not signed with the mirror's secret was dropped (a second publisher? "
    "a wrong secret?)"
)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _no_backlog() -> tuple[int, float | None]:
    return 0, None


@dataclass
class MirrorStatus:
    endpoint: str
    control_endpoint: str
    keyed: bool = False  # the mirror verifies every message with a shared secret
    max_lag_s: float = 2.0  # past this, the mirror is ``behind``
    hello: Hello | None = None
    synced: bool = False  # the runtime was put in the engine's state (snapshot)
    digests_checked_since_sync: int = 0  # exact needs one at least
    unsupported: bool = False  # the engine does what the mirror cannot follow
    shape_problem: str | None = None  # the engine restarted as another pool
    rebuilding: bool = False  # ... and the service is asked to rebuild from its handshake
    rebuilds: int = 0  # services rebuilt before this one (serve carries it across)
    last_message: float | None = None  # monotonic: the last message accepted
    last_refused: float | None = None  # monotonic: the last message refused
    messages: int = 0  # messages taken (verified where keyed, of the engine run followed)
    batches: int = 0
    writer_calls: int = 0  # groups of batches handed to the writer
    ops_applied: int = 0
    digests_checked: int = 0
    # the last digest that matched since the (re)sync: when (monotonic), and
    # the operations applied up to it -- how old the proof of ``exact`` is
    last_digest_at: float | None = None
    ops_at_digest: int = 0
    divergences: int = 0
    syncs: int = 0  # snapshots restored (the first sync included)
    resyncs: int = 0  # ... after the first: the first sync is no resync
    resync_failures: int = 0
    snapshot_timeouts: int = 0
    refused_replies: int = 0  # snapshot replies whose signature did not verify
    gaps: int = 0
    engine_drops: int = 0
    bad_messages: int = 0
    unauthenticated: int = 0  # messages dropped: their mac did not verify
    signed_unverified: int = 0  # signed messages a mirror without the secret took
    engine_restarts: int = 0  # a new boot seen
    stale_discarded: int = 0  # batches (and beats) of a previous engine, dropped unread
    backlog_dropped: int = 0  # messages dropped for a fresh snapshot (a backlog)
    last_seq: int = 0
    engine_steps: int = 0  # from the engine's beats: batches timed, the plugin's own time in them
    engine_cost_ns: int = 0
    # the plugin's time per step on the engine's thread (µs): p50, p99, max
    engine_cost_us: tuple[float, float, float] | None = None
    # how far the plugin's digest is behind its engine (None: not said)
    engine_reading: DigestReading | None = None
    last_problem: str | None = None
    last_problem_at: float | None = None
    lags_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    applied_batch: int | None = None  # the newest batch applied, and its engine step time
    applied_ts: float | None = None
    # (messages received and not yet applied, when the oldest of them came: monotonic)
    backlog: Callable[[], tuple[int, float | None]] = _no_backlog

    def seen(self) -> None:
        self.last_message = time.monotonic()

    def refused(self) -> None:
        self.unauthenticated += 1
        self.last_refused = time.monotonic()
        self.problem(REFUSED_WHY)

    def problem(self, what: str) -> None:
        self.last_problem = what
        self.last_problem_at = time.time()

    def resynced(self, seq: int) -> None:
        self.syncs += 1
        self.resyncs = self.syncs - 1
        self.synced = True
        self.digests_checked_since_sync = 0
        self.last_digest_at = None
        self.last_seq = seq

    def lost(self) -> None:
        """The runtime is no longer the engine's (a resync is due)."""
        self.synced = False
        self.digests_checked_since_sync = 0
        self.last_digest_at = None

    def digest_matched(self) -> None:
        """One of the engine's digests matched the mirror's own."""
        self.digests_checked += 1
        self.digests_checked_since_sync += 1
        self.last_digest_at = time.monotonic()
        self.ops_at_digest = self.ops_applied

    # --------------------------------------------------------------- reading

    def view(self) -> dict[str, Any]:
        """The state now: stale, behind, exact (see the module doc)."""
        now = time.monotonic()
        waiting, oldest = self.backlog()
        backlog_ms = None if oldest is None else round((now - oldest) * 1000.0, 1)
        behind = backlog_ms is not None and backlog_ms > self.max_lag_s * 1000.0
        # silent: nothing accepted lately, and nothing waiting that came lately
        recent = self.last_message is not None and now - self.last_message <= STALE_AFTER_S
        stale = not recent and not (oldest is not None and now - oldest <= STALE_AFTER_S)
        refusing = (
            self.keyed
            and self.last_refused is not None
            and now - self.last_refused <= STALE_AFTER_S
            and not recent
        )
        exact = (
            self.synced
            and self.digests_checked_since_sync > 0
            and not self.unsupported
            and self.shape_problem is None
            and not stale
            and not behind
        )
        if self.shape_problem is not None:
            state = "rebuilding" if self.rebuilding else "restart_needed"
        elif refusing:
            state = "refused"
        elif stale:
            state = "stale"
        elif not self.synced:
            state = "syncing"
        elif behind:
            state = "behind"
        elif exact:
            state = "exact"
        elif self.unsupported:
            state = "inexact"
        else:
            state = "synced"  # restored, no digest compared yet
        return {
            "state": state,
            "exact": exact,
            "stale": stale,
            "behind": behind,
            "refusing": refusing,
            "backlog": waiting,
            "backlog_ms": backlog_ms,
        }

    @property
    def stale(self) -> bool:
        return bool(self.view()["stale"])

    @property
    def exact(self) -> bool:
        return bool(self.view()["exact"])

    def stream_header(self) -> dict[str, Any]:
        """The live stream's ``mirror`` header: the newest applied batch, and
        whether the pool is the engine's now."""
        v = self.view()
        return {
            "engine_ts": self.applied_ts,
            "batch": self.applied_batch,
            "exact": v["exact"],
            "state": v["state"],
        }

    def figures(self) -> dict[str, float]:
        v = self.view()
        return (
            {
                "exact": float(v["exact"]),
                "synced": float(self.synced),
                "stale": float(v["stale"]),
                "behind": float(v["behind"]),
                "backlog": float(v["backlog"]),
                "resyncs_total": float(self.resyncs),
                "rebuilds_total": float(self.rebuilds),
                "gaps_total": float(self.gaps),
                "divergences_total": float(self.divergences),
                "unauthenticated_total": float(self.unauthenticated),
                "stale_discarded_total": float(self.stale_discarded),
                "backlog_dropped_total": float(self.backlog_dropped),
            }
            | self._plugin_figures()
            | self._reading_figures()
        )

    def _plugin_figures(self) -> dict[str, float]:
        """The plugin's time per step, once a beat said it (absent before: not known)."""
        cost = self.engine_cost_us
        if cost is None:
            return {}
        names = ("p50", "p99", "max")
        return {f"plugin_step_{q}_us": float(v) for q, v in zip(names, cost, strict=True)}

    def _reading_figures(self) -> dict[str, float]:
        """The plugin's digest's progress, once the engine said it (absent
        before, and the forward pass while too few were seen: not known)."""
        r = self.engine_reading
        if r is None:
            return {}
        out = {
            "plugin_digest_behind_blocks": float(r.behind),
            "plugin_digests_taken_total": float(r.taken),
        }
        if r.window_us is not None:
            out["plugin_forward_pass_ms"] = r.window_us / 1000.0
        if r.discarded is not None:
            out["plugin_digest_readings_discarded_total"] = float(r.discarded)
        if r.stopped is not None:
            out["plugin_digest_readings_stopped_total"] = float(r.stopped)
        if r.overrun is not None:
            out["plugin_digest_readings_overrun_total"] = float(r.overrun)
        if r.planned_too_long is not None:
            out["plugin_forward_plans_too_long_total"] = float(r.planned_too_long)
        return out

    def plugin_digest(self) -> dict[str, Any] | None:
        """``/api/mirror``'s ``plugin_digest``: the engine's digest behind by
        so many blocks (a rebuild's rows left), the shortest of its last
        forward passes (the plugin's time to read in: 0, an engine that never
        waits for its passes, gives it none), digests taken, readings thrown
        away (the engine moved during them), of those the ones the engine
        came back to, readings stopped in time (what they read kept), and
        forward passes planned by their tokens found too long (None: not
        said)."""
        r = self.engine_reading
        if r is None:
            return None
        return {
            "behind_blocks": r.behind,
            "sweep_rows_left": r.sweep_left,
            "forward_pass_ms": None if r.window_us is None else round(r.window_us / 1000.0, 3),
            "digests_taken": r.taken,
            "readings_discarded": r.discarded,
            "readings_stopped": r.stopped,
            "readings_overrun": r.overrun,
            "plans_too_long": r.planned_too_long,
        }

    def as_dict(self) -> dict[str, Any]:
        lags = list(self.lags_ms)
        v = self.view()
        hello = self.hello
        if v["refusing"]:
            peer = "refused"  # only messages the secret does not verify
        elif v["stale"]:
            peer = "silent"
        else:
            peer = "engine"
        return {
            "endpoint": self.endpoint,
            "control_endpoint": self.control_endpoint,
            "connected": hello is not None and not v["stale"],
            "state": v["state"],
            "peer": peer,
            # keyed: every message taken was verified; without a secret nothing is
            "authenticated": self.keyed,
            "stale": v["stale"],
            "seconds_since_message": None
            if self.last_message is None
            else round(time.monotonic() - self.last_message, 3),
            "synced": self.synced,
            "exact": v["exact"],
            "behind": v["behind"],
            "backlog": v["backlog"],
            "backlog_ms": v["backlog_ms"],
            "max_lag_ms": self.max_lag_s * 1000.0,
            "problem": self.shape_problem,
            "digests_checked_since_sync": self.digests_checked_since_sync,
            # how old the last match is (None: none since the sync): an engine
            # whose plugin cannot keep up sends fewer digests, and says so here
            "seconds_since_digest": None
            if self.last_digest_at is None
            else round(time.monotonic() - self.last_digest_at, 3),
            "ops_since_digest": None
            if self.last_digest_at is None
            else self.ops_applied - self.ops_at_digest,
            "divergences": self.divergences,
            "syncs": self.syncs,
            "resyncs": self.resyncs,
            "rebuilds": self.rebuilds,
            "resync_failures": self.resync_failures,
            "snapshot_timeouts": self.snapshot_timeouts,
            "refused_replies": self.refused_replies,
            "gaps": self.gaps,
            "engine_drops": self.engine_drops,
            "engine_restarts": self.engine_restarts,
            "bad_messages": self.bad_messages,
            "unauthenticated": self.unauthenticated,
            "signed_unverified": self.signed_unverified,
            "stale_discarded": self.stale_discarded,
            "backlog_dropped": self.backlog_dropped,
            "messages": self.messages,
            "batches": self.batches,
            "writer_calls": self.writer_calls,
            "ops_applied": self.ops_applied,
            "digests_checked": self.digests_checked,
            "last_seq": self.last_seq,
            "lag_ms": lags[-1] if lags else None,
            "lag_p50_ms": _quantile(lags, 0.5),
            "lag_p99_ms": _quantile(lags, 0.99),
            "plugin_us_per_step": round(self.engine_cost_ns / self.engine_steps / 1000, 2)
            if self.engine_steps
            else None,
            "plugin_step_us": None
            if self.engine_cost_us is None
            else dict(zip(("p50", "p99", "max"), self.engine_cost_us, strict=True)),
            "plugin_digest": self.plugin_digest(),
            "last_problem": self.last_problem,
            "last_problem_at": self.last_problem_at,
            "engine": msgspec.to_builtins(hello) if hello is not None else None,
        }


FIGURES_HELP = {
    "exact": "1 while the mirrored pool is proved the engine's (as GET /api/mirror says)",
    "synced": "1 while the mirror follows from a snapshot (exact needs a digest since)",
    "stale": "1 while the engine is silent",
    "behind": "1 while the mirror's oldest unapplied message is older than the lag bound",
    "backlog": "messages received and not yet applied",
    "resyncs_total": "snapshots restored after the first sync (gaps, divergences, restarts)",
    "rebuilds_total": "services rebuilt for an engine restarted as another pool",
    "gaps_total": "batches or operations that never arrived",
    "divergences_total": "digests or operations that disagreed with the engine's",
    "unauthenticated_total": "messages dropped: not signed with the mirror's secret",
    "stale_discarded_total": "batches of a previous run of the engine, dropped unread",
    "backlog_dropped_total": "messages dropped for a fresh snapshot (a backlog too large)",
    "plugin_step_p50_us": "the plugin's time per batch on the engine's thread, p50 (µs, 1 in 7)",
    "plugin_step_p99_us": "the plugin's time per batch on the engine's thread, p99 (µs, 1 in 7)",
    "plugin_step_max_us": "the plugin's longest batch on the engine's thread (µs, 1 in 7)",
    "plugin_digest_behind_blocks": "blocks the engine's digest has not read yet (the plugin's)",
    "plugin_digests_taken_total": "digests the plugin took of its engine's pool",
    "plugin_digest_readings_discarded_total": "the plugin's digest readings thrown away: "
    "the engine moved during them (read again)",
    "plugin_digest_readings_stopped_total": "the plugin's digest readings stopped at the "
    "forward pass's planned end, what they read kept",
    "plugin_digest_readings_overrun_total": "of the plugin's digest readings thrown away, "
    "those still running when the engine's thread came back",
    "plugin_forward_plans_too_long_total": "forward passes planned by the passes of as many "
    "tokens that ended before that plan (each turns it off for 64 passes)",
    "plugin_forward_pass_ms": "the shortest of the engine's last forward passes: the plugin's "
    "time to read its pool in (ms; about 0: an engine that never waits for its passes)",
}


def figures_of(status: MirrorStatus) -> Figures:
    return Figures(status.figures, FIGURES_HELP)
