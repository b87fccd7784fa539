"""The stat tiles at a recorded moment (time travel): each figure as it was
then, or ``None`` with the reason.

The block counts, usage and running requests come from the rebuilt moment
itself.  The windowed hit rates (1m, 5m), the since-start (or since-reset)
rate and the waiting requests are the figures the server computed from the
prefix-cache counters at that time: the engine's series point at or just
before the moment.  A moment older than the series kept has none of them.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

POINT_GAP_S = 2.0  # the series point must be this close to the moment (idle ticks: 0.5 s)
WINDOWED = ("hit_rate_1m", "hit_rate_5m", "hit_rate_since", "waiting")


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def moment_tiles(series: list[dict[str, float]], ts: float, usage: float) -> dict[str, Any]:
    """The tiles' figures at unix time ``ts`` from ``series`` (time order)."""
    out: dict[str, Any] = {"usage": usage, "point_ts": None, "reason": None}
    out.update(dict.fromkeys(WINDOWED))
    out["since_label"] = None
    if not series:
        out["reason"] = "the server holds no series point"
        return out
    times = [p["ts"] for p in series]
    i = bisect.bisect_right(times, ts) - 1
    if i < 0 or ts - times[i] > POINT_GAP_S:
        kept = times[-1] - times[0]
        out["reason"] = (
            f"the moment is older than the series the server keeps (the last {kept:.0f} s)"
            if i < 0
            else "no series point near the moment"
        )
        return out
    p = series[i]
    out["point_ts"] = p["ts"]
    for k in WINDOWED:
        out[k] = _num(p.get(k))
    resets = p.get("hit_rate_resets")
    out["since_label"] = None if resets is None else ("since reset" if resets else "since start")
    return out
