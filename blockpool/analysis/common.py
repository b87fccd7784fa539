"""Small helpers shared by the analysis modules."""

from __future__ import annotations

from typing import Any

from blockpool.common.histogram import COUNT_BUCKETS, SECONDS_BUCKETS
from blockpool.common.histogram import BucketHistogram as Hist
from blockpool.common.keys import digest64 as h64
from blockpool.common.keys import hex64

__all__ = ["COUNT_BUCKETS", "SECONDS_BUCKETS", "Hist", "h64", "hex64", "trim_dict"]


def trim_dict(d: dict[Any, Any], keep: int) -> None:
    """Keep only the ``keep`` most recently inserted keys (in place)."""
    drop = len(d) - keep
    if drop <= 0:
        return
    it = iter(list(d)[:drop])
    for k in it:
        del d[k]
