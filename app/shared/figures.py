"""A part's ``/metrics`` source (``Figures``); the counters themselves are
declared with ``blockpool.common.figures`` (re-exported here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from blockpool.common.figures import counter, helps, rest_view, totals

__all__ = ["Figures", "counter", "helps", "rest_view", "totals"]


@dataclass(frozen=True)
class Figures:
    """A part's ``/metrics`` source: its readings, and the HELP of each."""

    read: Callable[[], dict[str, float]]
    help: dict[str, str]

    def __call__(self) -> dict[str, float]:
        return self.read()
