"""Reads that cost O(pool) or more per call, rationed per client and in all.

With a token set, reads stay open (unless ``protect_reads``), but the costly
ones — a prefix lookup of up to 262,144 tokens (≈ 260 ms of engine time), a
K/V verify, a scan of the hash map, the prefix tree or the free queue, a
moment rebuilt for time travel, one request's story (it scans the
recording), the recording's export (every recorded prompt) — are rationed
for a client that does not present the token:

- **per client**: a bucket of ``costly_reads_burst`` units per client,
  refilled at ``costly_reads_per_s`` units a second.  The client is its
  address as the socket gives it (forwarded headers count only from
  ``--forwarded-allow-ips`` proxies, app/shared/serving.py); every loopback address
  (127.0.0.0/8, ::1) is one client, an IPv6 client is its /64.
- **in all**: every tokenless client together draws on one more bucket,
  ``costly_reads_global_burst`` units refilled at
  ``costly_reads_global_per_s``, so that many addresses cannot add up to
  more than that.

A call takes one unit, plus one per 256 KiB of request body (a
262,144-token prompt is ≈ 1.8 MB: 8 units); the export and its size take
half the burst each up front, then one unit per MiB they wrote once done
(the bucket may go below zero: the next costly read waits for the debt to
refill), so that exports one after the other are bounded by the bytes they
send.  Beyond the ration: 429 ``too_many_requests`` with ``Retry-After``.
With the token (or on a server without one, where every write is open
anyway) nothing is rationed.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from fastapi import Depends, Request

from app.api.deps import require_read, token_given
from app.shared.errors import OperationError
from app.web import auth_first

MAX_CLIENTS = 10_000  # buckets kept (least recently used dropped first)


class TooManyRequests(OperationError):
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

    def charge(self, key: str, cost: float) -> None:
        """Take ``cost`` more units for work already done: the level may go
        below zero (a debt the refill pays back before the next call)."""
        now = self.clock()  # type: ignore[operator]
        with self._lock:
            level, then = self._buckets.pop(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - then) * self.per_s) - cost
            self._buckets[key] = (level, now)
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)

    def refund(self, key: str, cost: float) -> None:
        """Give back what ``take`` took (the other bucket refused the call)."""
        with self._lock:
            entry = self._buckets.get(key)
            if entry is not None:
                self._buckets[key] = (min(float(self.burst), entry[0] + cost), entry[1])


def buckets_for(request: Request) -> Buckets:
    state = request.app.state
    buckets: Buckets | None = getattr(state, "costly_buckets", None)
    if buckets is None:
        s = state.settings
        buckets = state.costly_buckets = Buckets(s.costly_reads_burst, s.costly_reads_per_s)
    return buckets


def global_bucket_for(request: Request) -> Buckets:
    state = request.app.state
    buckets: Buckets | None = getattr(state, "costly_global_bucket", None)
    if buckets is None:
        s = state.settings
        buckets = state.costly_global_bucket = Buckets(
            s.costly_reads_global_burst, s.costly_reads_global_per_s
        )
    return buckets


BODY_UNIT = 256 * 1024  # request bytes per extra unit
EXPORT_UNIT = 1024 * 1024  # bytes an export wrote per unit charged after it
GLOBAL = "*"  # the one key of the bucket all tokenless clients share


def client_key(host: str | None) -> str:
    """The ration's client: its address; every loopback address is one
    client (127.0.0.x are all this machine), an IPv6 client its /64."""
    if not host:
        return "unknown"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)


def _too_many(wait: float, who: str) -> TooManyRequests:
    return TooManyRequests(
        f"too many costly reads {who} without the token: retry in "
        f"{math.ceil(wait)} s, or send 'Authorization: Bearer <token>'",
        retry_after_s=max(1, math.ceil(wait)),
    )


def _ration(request: Request, cost: float) -> None:
    require_read(request)
    token = request.app.state.settings.token
    if token is None or token_given(request, token):
        return
    client = client_key(request.client.host if request.client else None)
    per_client = buckets_for(request)
    wait = per_client.take(client, cost)
    if wait > 0:
        raise _too_many(wait, f"from {client}")
    wait = global_bucket_for(request).take(GLOBAL, cost)
    if wait > 0:
        per_client.refund(client, cost)
        raise _too_many(wait, "from all clients together")
    request.state.costly_client = client  # what charge_written charges


def charge_written(request: Request, nbytes: int) -> None:
    """After a rationed export (or its size): one unit per MiB it wrote,
    to its client and to the shared bucket (nothing when not rationed)."""
    client: str | None = getattr(request.state, "costly_client", None)
    units = nbytes // EXPORT_UNIT
    if client is None or units <= 0:
        return
    buckets_for(request).charge(client, units)
    global_bucket_for(request).charge(GLOBAL, units)


def charged_lines(request: Request, lines: Iterable[str]) -> Iterator[str]:
    """``lines`` as they are, charged by their size once done (finished,
    failed or cut off by the client).  A plain generator: the response
    iterates it in a worker thread, as it did the lines."""
    written = 0
    try:
        for line in lines:
            written += len(line)
            yield line
    finally:
        charge_written(request, written)


def require_costly_read(request: Request) -> None:
    """A costly read: the read rule, then the ration for tokenless clients
    (one unit, plus one per 256 KiB of body)."""
    try:
        size = max(0, int(request.headers.get("content-length", "0")))
    except ValueError:
        size = 0
    _ration(request, 1.0 + size // BODY_UNIT)


def require_costly_export(request: Request) -> None:
    """The recording's export, or its size (which writes it to count it):
    half the burst each, so that the dashboard's size-then-download fits."""
    _ration(request, request.app.state.settings.costly_reads_burst / 2)


CostlyRead = Depends(require_costly_read)
CostlyExport = Depends(require_costly_export)
# before the body: the read rule only (the ration is taken by the route)
auth_first.register(require_costly_read, require_read)
auth_first.register(require_costly_export, require_read)
