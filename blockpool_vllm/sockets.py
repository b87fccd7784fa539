"""The sender's two sockets, bound with every bound they keep (the rules:
blockpool_vllm/sender.py): a PUB for the stream, a ROUTER for snapshot
requests -- and bound again and again while they cannot be
(``StreamBinding``): an engine whose port is taken runs unfollowed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from blockpool.mirror import protocol as wire

logger = logging.getLogger("blockpool_vllm")

PEER_RCVHWM = 16  # requests queued per peer
HANDSHAKE_MS = 5000  # a connection that never completes ZMTP's greeting is dropped
HEARTBEAT_MS = 10_000


def bind_stream(
    ctx: Any, endpoint: str, control_endpoint: str, *, hwm: int, peer_hwm: int
) -> tuple[Any, Any, int]:
    """(pub, ctl, the control socket's port), bound; every socket made is
    closed when any step fails (the failure propagates)."""
    made: list[Any] = []
    try:
        pub = ctx.socket(zmq.PUB)
        made.append(pub)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, hwm)
        pub.setsockopt(zmq.MAXMSGSIZE, 1024)  # a subscriber only sends its topic
        pub.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        pub.bind(endpoint)
        ctl = ctx.socket(zmq.ROUTER)
        made.append(ctl)
        ctl.setsockopt(zmq.LINGER, 0)
        ctl.setsockopt(zmq.MAXMSGSIZE, wire.MAX_CONTROL_BYTES)
        ctl.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply that cannot go: an error, counted
        ctl.setsockopt(zmq.SNDHWM, peer_hwm)
        ctl.setsockopt(zmq.RCVHWM, PEER_RCVHWM)
        ctl.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        ctl.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        ctl.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
        ctl.setsockopt(zmq.TCP_KEEPALIVE, 1)
        ctl.bind(control_endpoint)
        last = ctl.getsockopt(zmq.LAST_ENDPOINT)
        port = int(last.decode().rpartition(":")[2])
    except BaseException:
        for s in made:
            s.close(0)
        raise
    return pub, ctl, port


class StreamBinding:
    """The two sockets on ``endpoint`` and ``control_endpoint``, bound by
    ``until_bound``: a failure (a port in use, a bad endpoint, no more
    sockets) logged once and retried every ``retry_s``, the success after
    failures logged too."""

    def __init__(
        self, endpoint: str, control_endpoint: str, *, hwm: int, peer_hwm: int, retry_s: float
    ) -> None:
        self.endpoint = endpoint
        self.control_endpoint = control_endpoint
        self.hwm = hwm
        self.peer_hwm = peer_hwm
        self.retry_s = retry_s
        self.bound = False
        self.failures = 0
        self.error: str | None = None
        self.control_port: int | None = None

    def until_bound(
        self,
        ctx: Any,
        stop: threading.Event,
        tried: Callable[[], None],
        meanwhile: Callable[[], None],
    ) -> tuple[Any, Any] | None:
        """(pub, ctl) once bound; None once ``stop`` is set first.  ``tried``
        after each attempt, ``meanwhile`` every 50 ms between two."""
        while not stop.is_set():
            try:
                pub, ctl, self.control_port = bind_stream(
                    ctx,
                    self.endpoint,
                    self.control_endpoint,
                    hwm=self.hwm,
                    peer_hwm=self.peer_hwm,
                )
            except Exception as exc:  # a port in use, a bad endpoint, no more sockets
                self.failures += 1
                self.error = str(exc)
                if self.failures == 1:
                    logger.warning(
                        "blockpool mirror: cannot bind %s / %s (%s); the engine runs "
                        "unfollowed, retrying every %g s",
                        self.endpoint,
                        self.control_endpoint,
                        exc,
                        self.retry_s,
                    )
            else:
                self.bound, self.error = True, None
                if self.failures:
                    logger.warning(
                        "blockpool mirror: bound %s / %s after %d failed attempts",
                        self.endpoint,
                        self.control_endpoint,
                        self.failures,
                    )
                tried()
                return pub, ctl
            tried()
            deadline = time.monotonic() + self.retry_s
            while not stop.is_set() and time.monotonic() < deadline:
                meanwhile()
                stop.wait(0.05)
        return None
