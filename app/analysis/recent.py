"""The analysis' recent history, for a page that has just opened.

The dashboard's analysis charts are rates between consecutive ``analysis``
sections of the stream (about one a second).  A page that opens late would
start them on an empty axis; this ring keeps the cumulative counters of the
sections (and the token usage beside them) once a second, as a tick
listener, so ``GET /api/analysis/recent`` can hand the page the last minutes
at once.  Only the counters the charts need are kept: a few hundred bytes a
second, bounded by ``capacity``.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from blockpool.analysis import views as analysis_views

if TYPE_CHECKING:
    from app.analysis.host import AnalysisHost
    from blockpool.runtime import PoolRuntime


class AnalysedEngine(Protocol):
    """What the ring reads of the engine (app.pool.engine.Engine)."""

    @property
    def analysis(self) -> AnalysisHost | None: ...

    @property
    def runtime(self) -> PoolRuntime: ...

    @property
    def unknown(self) -> dict[str, str]: ...


class TickStamp(Protocol):
    """A tick as the engine hands it to its listeners."""

    @property
    def ts(self) -> float: ...


EVERY_S = 1.0
CAPACITY = 900  # 15 minutes at one a second
KEYS = ("ts", "misses", "miss_tokens", "hit_blocks", "regrets", "evictions")


class RecentAnalysis:
    def __init__(
        self, engine: AnalysedEngine, capacity: int = CAPACITY, every_s: float = EVERY_S
    ) -> None:
        self.engine = engine
        self.every_s = every_s
        self.points: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._at = 0.0

    def on_tick(self, data: TickStamp) -> None:
        """A tick listener (engine context): one sample a second at most."""
        if data.ts - self._at < self.every_s:
            return
        self._at = data.ts
        an = self.engine.analysis
        section = an.stream_section() if an is not None else None
        if section is None:  # the worker has not reported yet
            return
        last = self.points[-1] if self.points else None
        if last is not None and last["ts"] == section.get("ts"):
            return  # the worker's report has not moved
        point = {k: section.get(k) for k in KEYS}
        point["tokens"] = analysis_views.tokens(
            self.engine.runtime, self.engine.unknown.get("tokens")
        )
        point["tokens_ts"] = data.ts
        self.points.append(point)

    def view(self, seconds: float) -> dict[str, Any]:
        pts = list(self.points)
        if pts:
            newest = pts[-1]["ts"]
            pts = [p for p in pts if newest - p["ts"] <= seconds]
        return {
            "enabled": self.engine.analysis is not None,
            "every_seconds": self.every_s,
            "capacity": self.points.maxlen,
            "sections": pts,
        }
