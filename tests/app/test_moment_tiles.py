"""The stat tiles at a recorded moment: the series point then, or none with
the reason; the since tile's label after a reset."""

from __future__ import annotations

import math

from app.pool.moment_tiles import moment_tiles
from app.pool.windowed import HitWindow


def _pt(ts: float, **kw: float) -> dict[str, float]:
    base = {"ts": ts, "hit_rate_1m": 0.5, "hit_rate_5m": 0.4, "hit_rate_since": 0.3}
    return {**base, "waiting": 2.0, "hit_rate_resets": 0.0, **kw}


def test_the_point_at_or_before_the_moment() -> None:
    series = [_pt(100.0), _pt(101.0, hit_rate_1m=0.8, waiting=5.0), _pt(102.0)]
    t = moment_tiles(series, 101.7, 0.25)
    assert t["point_ts"] == 101.0 and t["reason"] is None
    assert (t["hit_rate_1m"], t["hit_rate_5m"], t["hit_rate_since"]) == (0.8, 0.4, 0.3)
    assert t["waiting"] == 5.0 and t["usage"] == 0.25 and t["since_label"] == "since start"


def test_no_value_is_none_and_a_reset_says_since_reset() -> None:
    t = moment_tiles([_pt(10.0, hit_rate_1m=math.nan, hit_rate_resets=1.0)], 10.5, 0.0)
    assert t["hit_rate_1m"] is None and t["hit_rate_5m"] == 0.4
    assert t["since_label"] == "since reset"


def test_a_moment_older_than_the_series_has_none_with_the_reason() -> None:
    series = [_pt(500.0), _pt(800.0)]
    t = moment_tiles(series, 100.0, 0.5)
    assert t["point_ts"] is None and t["hit_rate_1m"] is None and t["waiting"] is None
    assert "older than the series" in t["reason"] and "300 s" in t["reason"]
    gap = moment_tiles(series, 700.0, 0.5)  # a point, but 200 s before the moment
    assert gap["hit_rate_5m"] is None and gap["reason"] == "no series point near the moment"
    assert moment_tiles([], 1.0, 0.0)["reason"] == "the server holds no series point"


def test_the_window_point_counts_resets() -> None:
    now = [0.0]
    w = HitWindow(clock=lambda: now[0])
    assert w.point(1, 2, 0)["hit_rate_resets"] == 0.0
    now[0] = 2.0
    assert w.point(3, 4, 1)["hit_rate_resets"] == 1.0
