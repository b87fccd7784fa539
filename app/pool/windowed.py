"""The prefix hit rate over a window, as Grafana shows it.

An operator compares our dashboard with a Grafana panel of
``rate(vllm:prefix_cache_hits_total[1m]) / rate(vllm:prefix_cache_queries_total[1m])``.
``HitWindow`` keeps a ring of ``(t, hits, queries)`` samples of those two
counters (taken at tick time, at most one per ``sample_s``) and evaluates that
expression over the samples exactly as Prometheus' ``rate()`` does
(promql/functions.go ``extrapolatedRate``), at the time of the newest sample:

* the samples in the left-open range ``(t - range, t]``; fewer than two: no value;
* the increase from the first to the last, a drop counted as a counter reset
  (the value after the drop is the increase since it);
* extrapolated to the range's edges: by the distance to an edge when it is
  under 1.1 average sample intervals, else by half an interval; and never
  below the counter's zero point (a counter that started inside the range);
* divided by the range in seconds; hits over queries, ``nan`` for 0 / 0.

Both windows and the since-start figure restart on a prefix-cache reset
(``epoch``: the count of resets done): samples from before it are dropped and
"since start" becomes "since the reset".  The counters in ``/metrics`` never
go back; only these figures start over.  Library-free: the clock is injected.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Sequence

WINDOWS_S = (60.0, 300.0)
SAMPLE_S = 1.0


def prom_rate(samples: Sequence[tuple[float, float]], at: float, range_s: float) -> float | None:
    """Prometheus ``rate(counter[range_s])`` evaluated at ``at`` over
    ``(t, value)`` samples in time order; None where Prometheus has no value."""
    start = at - range_s
    pts = [(t, v) for t, v in samples if start < t <= at]
    if len(pts) < 2:
        return None
    first_t, first_v = pts[0]
    last_t, last_v = pts[-1]
    result = last_v - first_v
    prev = 0.0
    for _, v in pts:
        if v < prev:
            result += prev
        prev = v
    to_start = first_t - start
    to_end = at - last_t
    sampled = last_t - first_t
    avg = sampled / (len(pts) - 1)
    if result > 0 and first_v >= 0:
        to_zero = sampled * (first_v / result)
        to_start = min(to_start, to_zero)
    threshold = avg * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else avg / 2
    interval += to_end if to_end < threshold else avg / 2
    return result * (interval / sampled) / range_s


class HitWindow:
    """Samples of the prefix-cache counters; the hit rate over each window."""

    def __init__(
        self,
        windows_s: Sequence[float] = WINDOWS_S,
        sample_s: float = SAMPLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.windows_s = tuple(windows_s)
        self.sample_s = sample_s
        self.clock = clock
        self.keep_s = max(self.windows_s)
        self.samples: deque[tuple[float, int, int]] = deque()  # (t, hits, queries)
        self.epoch: int | None = None
        self.base = (0, 0)  # (hits, queries) at the start or the last reset
        self.since_t = clock()  # when "since start" began (the clock's time)
        self.restarts = 0
        self._rates: dict[float, float | None] = dict.fromkeys(self.windows_s)

    def observe(self, hits: int, queries: int, epoch: int = 0) -> None:
        """The counters now (tick time); ``epoch`` changes on a prefix-cache reset."""
        now = self.clock()
        if self.epoch is None:  # the counters count from 0 at the window's start
            self.epoch = epoch
        elif epoch != self.epoch:
            self.epoch = epoch
            self.samples.clear()
            self.base = (hits, queries)
            self.since_t = now
            self.restarts += 1
            self._rates = dict.fromkeys(self.windows_s)
        s = self.samples
        if s and now - s[-1][0] < self.sample_s:
            return
        s.append((now, hits, queries))
        while s and s[0][0] <= now - self.keep_s:
            s.popleft()
        self._evaluate(now)

    def _evaluate(self, at: float) -> None:
        s = self.samples
        times = [t for t, _, _ in s]
        for w in self.windows_s:
            i = bisect.bisect_right(times, at - w)
            part = list(s)[i:]
            h = prom_rate([(t, float(x)) for t, x, _ in part], at, w)
            q = prom_rate([(t, float(x)) for t, _, x in part], at, w)
            if h is None or q is None:
                self._rates[w] = None
            else:
                self._rates[w] = h / q if q else math.nan
        self.last_at = at

    def rate(self, window_s: float) -> float | None:
        """hits/queries over the window (None: under two samples; nan: no query)."""
        return self._rates[window_s]

    def since_start(self, hits: int, queries: int) -> float | None:
        """hits/queries since the start or the last reset (None: no query yet)."""
        dq = queries - self.base[1]
        return (hits - self.base[0]) / dq if dq else None

    def point(self, hits: int, queries: int, epoch: int = 0) -> dict[str, float]:
        """Observe, then the series point's fields (nan where there is no value)."""
        self.observe(hits, queries, epoch)
        out = {f"hit_rate_{_label(w)}": _num(self._rates[w]) for w in self.windows_s}
        out["hit_rate_since"] = _num(self.since_start(hits, queries))
        out["hit_rate_resets"] = float(self.restarts)  # 0: "since start", else "since reset"
        return out

    def summary(self, hits: int, queries: int) -> dict[str, object]:
        """The REST view: each window's figure, labelled, and what it is."""
        return {
            "windows": [
                {
                    "label": f"hit rate {_label(w)}",
                    "seconds": w,
                    "hit_rate": _finite(self._rates[w]),
                    "promql": (
                        f"rate(vllm:prefix_cache_hits_total[{_label(w)}]) / "
                        f"rate(vllm:prefix_cache_queries_total[{_label(w)}])"
                    ),
                }
                for w in self.windows_s
            ],
            "since_start": {
                "label": "since reset" if self.restarts else "since start",
                "hit_rate": self.since_start(hits, queries),
                "hits_tokens": hits - self.base[0],
                "queries_tokens": queries - self.base[1],
                "seconds": self.clock() - self.since_t,
            },
            "restarts": self.restarts,
            "samples": len(self.samples),
            "sample_seconds": self.sample_s,
        }


def _label(w: float) -> str:
    return f"{int(w // 60)}m" if w % 60 == 0 else f"{w:g}s"


def _num(v: float | None) -> float:
    return math.nan if v is None else v


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None
