"""What ``GET /api/mirror`` reports: the mirror's health, counted."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec

from blockpool.mirror.protocol import Hello

STALE_AFTER_S = 3.0  # no message (batch, beat or hello) for this long: stale


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@dataclass
class MirrorStatus:
    endpoint: str
    control_endpoint: str
    hello: Hello | None = None
    synced: bool = False  # the runtime was put in the engine's state (snapshot)
    exact: bool = False  # synced, every check since agreed, nothing unsupported
    last_message: float | None = None  # monotonic
    batches: int = 0
    ops_applied: int = 0
    digests_checked: int = 0
    divergences: int = 0
    resyncs: int = 0
    resync_failures: int = 0
    gaps: int = 0
    engine_drops: int = 0
    bad_messages: int = 0
    last_seq: int = 0
    engine_steps: int = 0  # from the engine's beats: batches made, the plugin's own time
    engine_cost_ns: int = 0
    last_problem: str | None = None
    last_problem_at: float | None = None
    lags_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    applied_batch: int | None = None  # the newest batch applied, and its engine step time
    applied_ts: float | None = None

    def stream_header(self) -> dict[str, Any] | None:
        """The live stream's ``mirror`` header: the newest applied batch."""
        if self.applied_batch is None:
            return None
        return {"engine_ts": self.applied_ts, "batch": self.applied_batch}

    def seen(self) -> None:
        self.last_message = time.monotonic()

    @property
    def stale(self) -> bool:
        return self.last_message is None or time.monotonic() - self.last_message > STALE_AFTER_S

    def problem(self, what: str) -> None:
        self.last_problem = what
        self.last_problem_at = time.time()

    def as_dict(self) -> dict[str, Any]:
        lags = list(self.lags_ms)
        stale = self.stale
        hello = self.hello
        return {
            "endpoint": self.endpoint,
            "control_endpoint": self.control_endpoint,
            "connected": hello is not None and not stale,
            "stale": stale,
            "seconds_since_message": None
            if self.last_message is None
            else round(time.monotonic() - self.last_message, 3),
            "synced": self.synced,
            "exact": self.exact and not stale,
            "divergences": self.divergences,
            "resyncs": self.resyncs,
            "resync_failures": self.resync_failures,
            "gaps": self.gaps,
            "engine_drops": self.engine_drops,
            "bad_messages": self.bad_messages,
            "batches": self.batches,
            "ops_applied": self.ops_applied,
            "digests_checked": self.digests_checked,
            "last_seq": self.last_seq,
            "lag_ms": lags[-1] if lags else None,
            "lag_p50_ms": _quantile(lags, 0.5),
            "lag_p99_ms": _quantile(lags, 0.99),
            "plugin_us_per_step": round(self.engine_cost_ns / self.engine_steps / 1000, 2)
            if self.engine_steps
            else None,
            "last_problem": self.last_problem,
            "last_problem_at": self.last_problem_at,
            "engine": msgspec.to_builtins(hello) if hello is not None else None,
        }
