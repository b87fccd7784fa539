"""Reads that cost O(pool) or more per call, rationed per client.

With a token set, reads stay open (unless ``protect_reads``), but the costly
ones — a prefix lookup of up to 262,144 tokens (≈ 260 ms of engine time), a
K/V verify, a scan of the hash map, the prefix tree or the free queue, a
moment rebuilt for time travel, the recording's export (every recorded
prompt) — are rationed for a client that does not present the token: a
bucket of ``costly_reads_burst`` units per client address, refilled at
``costly_reads_per_s`` units a second.  A call takes one unit, plus one per
256 KiB of request body (a 262,144-token prompt is ≈ 1.8 MB: 8 units); an
export takes the whole burst.  Beyond the ration: 429 ``too_many_requests``
with ``Retry-After``.  With the token (or on a server without one, where
every write is open anyway) nothing is rationed.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict

from fastapi import Depends, Request

from app.api.deps import require_read, token_given
from app.errors import ApiError

MAX_CLIENTS = 10_000  # buckets kept (least recently used dropped first)


class TooManyRequests(ApiError):
    status = 429
    code = "too_many_requests"


class Buckets:
    """Token buckets per client key (thread-safe: sync dependencies run in
    FastAPI's thread pool)."""

    def __init__(self, burst: int, per_s: float, clock: object = time.monotonic) -> None:
        self.burst = burst
        self.per_s = per_s
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.refused = 0

    def take(self, key: str, cost: float = 1.0) -> float:
        """Take ``cost`` units for ``key`` (at most the burst): 0.0 when
        allowed, else the seconds until it would be."""
        cost = min(cost, float(self.burst))
        now = self.clock()  # type: ignore[operator]
        with self._lock:
            level, then = self._buckets.pop(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - then) * self.per_s)
            wait = 0.0
            if level >= cost:
                level -= cost
            else:
                wait = (cost - level) / self.per_s
                self.refused += 1
            self._buckets[key] = (level, now)
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)
            return wait


def buckets_for(request: Request) -> Buckets:
    state = request.app.state
    buckets: Buckets | None = getattr(state, "costly_buckets", None)
    if buckets is None:
        s = state.settings
        buckets = state.costly_buckets = Buckets(s.costly_reads_burst, s.costly_reads_per_s)
    return buckets


BODY_UNIT = 256 * 1024  # request bytes per extra unit


def _ration(request: Request, cost: float) -> None:
    require_read(request)
    token = request.app.state.settings.token
    if token is None or token_given(request, token):
        return
    client = request.client.host if request.client else "unknown"
    wait = buckets_for(request).take(client, cost)
    if wait > 0:
        raise TooManyRequests(
            f"too many costly reads from {client} without the token: retry in "
            f"{math.ceil(wait)} s, or send 'Authorization: Bearer <token>'",
            retry_after_s=math.ceil(wait),
        )


def require_costly_read(request: Request) -> None:
    """A costly read: the read rule, then the ration for tokenless clients
    (one unit, plus one per 256 KiB of body)."""
    try:
        size = max(0, int(request.headers.get("content-length", "0")))
    except ValueError:
        size = 0
    _ration(request, 1.0 + size // BODY_UNIT)


def require_costly_export(request: Request) -> None:
    """The recording's export: the whole ration of a tokenless client."""
    _ration(request, float(request.app.state.settings.costly_reads_burst))


CostlyRead = Depends(require_costly_read)
CostlyExport = Depends(require_costly_export)
