"""The service's full garbage collections, paced by its ticks.

CPython collects its oldest generation whenever the objects promoted into it
since the last full collection pass a quarter of those that survived it.  A
service following a GPU engine keeps about 200,000 KV events in its event
log, each holding its list of hashes: some 100,000 new long-lived lists a
second.  Under ``make bench-mirror-rate`` (200 steps/s) a full collection
then came every 1.4 s and took 15 to 270 ms, every operation and every HTTP
request waiting meanwhile: about 6 % of the writer's time, and most of the
mirror's lag spikes.

While the service runs, ``GcPacer`` keeps the oldest generation out of the
interpreter's automatic reach (its threshold raised past any count) and, at
tick time:

* every ``FREEZE_EVERY_S``, collects the young generations and freezes what
  survived them (``gc.freeze``: moved out of every later collection's
  traversal, at no cost).  A frozen object that dies by its reference count
  -- an event the log lets go -- is freed as any other;
* now and then thaws everything and runs a real full collection, then
  freezes again: ``FULL_EVERY_S`` after the last one, or later if that one
  took more than ``BUDGET`` of the time since (cyclic garbage that was
  frozen lives that long).

The young generations are still collected as the interpreter does.

The interpreter's collector is one per process: the first paced user sets
the threshold and freezes what lives then (the pool's blocks), the last one
to stop puts the threshold it found back and thaws what was frozen.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from blockpool.common.figures import Figures, counter, helps, totals

FREEZE_EVERY_S = 1.0  # survivors of the young generations frozen this often
FULL_EVERY_S = 300.0  # a real full collection this long after the last...
BUDGET = 0.005  # ... or later, so that they take at most this share of the time
OUT_OF_REACH = 1 << 30  # the oldest generation's threshold while paced

_lock = threading.Lock()
_users = 0
_saved: tuple[int, int, int] | None = None


def _pace() -> None:
    global _users, _saved
    with _lock:
        if _users == 0:
            young, middle, _ = _saved = gc.get_threshold()
            gc.set_threshold(young, middle, OUT_OF_REACH)
            # what lives now -- the pool's blocks, built before the engine
            # starts -- out of the collector's way at once
            gc.freeze()
        _users += 1


def _unpace() -> None:
    global _users, _saved
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and _saved is not None:
            gc.set_threshold(*_saved)
            _saved = None
            gc.unfreeze()  # what it froze is the collector's again


@dataclass
class PacerCounts:
    freezes: int = counter("Young-generation survivors frozen (cheap: no traversal).")
    full_collections: int = counter(
        "Real full garbage collections (everything thawed, collected, frozen again)."
    )
    full_collection_ms: int = counter(
        "Milliseconds spent in those full collections (the writer waits meanwhile)."
    )


HELP = {
    **helps(PacerCounts),
    "last_full_collection_ms": "How long the last real full garbage collection took.",
    "frozen_objects": "Objects the collector skips (frozen), now.",
}


class GcPacer:
    """Full collections at tick time, within a budget (see the module doc)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        collector: ModuleType = gc,
    ) -> None:
        self._clock = clock
        self._gc = collector
        self.counts = PacerCounts()
        self.last_ms: float | None = None  # not known before the first one
        self._next_freeze = 0.0
        self._next_full = 0.0
        self._paced = False
        self.figures = Figures(self.readings, HELP)

    def start(self) -> None:
        if not self._paced:
            _pace()
            self._paced = True
            now = self._clock()
            self._next_freeze = now + FREEZE_EVERY_S
            self._next_full = now + FULL_EVERY_S

    def stop(self) -> None:
        if self._paced:
            self._paced = False
            _unpace()

    @property
    def paced(self) -> bool:
        return self._paced

    def maybe_collect(self) -> str | None:
        """Tick time: a full collection or a freeze if one is due (which ran)."""
        if not self._paced:
            return None
        t0 = self._clock()
        g = self._gc
        if t0 >= self._next_full:
            g.unfreeze()
            g.collect(2)
            g.freeze()
            t1 = self._clock()
            took = t1 - t0
            self._next_full = t1 + max(FULL_EVERY_S, took / BUDGET)
            self._next_freeze = t1 + FREEZE_EVERY_S
            self.counts.full_collections += 1
            self.counts.full_collection_ms += round(took * 1000)
            self.last_ms = took * 1000
            return "full"
        if t0 >= self._next_freeze:
            g.collect(1)
            g.freeze()
            self._next_freeze = self._clock() + FREEZE_EVERY_S
            self.counts.freezes += 1
            return "freeze"
        return None

    def readings(self) -> dict[str, float]:
        out: dict[str, float] = dict(totals(self.counts))
        if self.last_ms is not None:
            out["last_full_collection_ms"] = self.last_ms
        out["frozen_objects"] = self._gc.get_freeze_count()
        return out
