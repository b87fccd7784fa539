"""The sender's two sockets, bound with every bound they keep (the rules:
blockpool_vllm/sender.py): a PUB for the stream, a ROUTER for snapshot
requests."""

from __future__ import annotations

from typing import Any

import zmq

from blockpool.mirror import protocol as wire

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
