"""The KV-event publisher's sockets: the PUB it sends on, bound or
connected (vLLM's rule), and the replay ROUTER."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zmq

from blockpool.kvevents.config import KVEventsConfig


@dataclass
class Sockets:
    """The opened sockets and the addresses they got."""

    pub: zmq.Socket[Any]
    router: zmq.Socket[Any] | None
    bound_endpoint: str
    bound_replay_endpoint: str | None


def open_sockets(ctx: zmq.Context[Any], cfg: KVEventsConfig) -> Sockets:
    """The PUB socket (bound or connected, as ``cfg.binds()`` says) and the
    replay ROUTER (when ``cfg`` has a replay endpoint), with their addresses."""
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.set_hwm(cfg.hwm)
    router: zmq.Socket[Any] | None = None
    bound_replay: str | None = None
    try:
        endpoint = cfg.pub_endpoint
        if cfg.binds():
            pub.bind(endpoint)
            bound = last_endpoint(pub, endpoint)
        else:
            pub.connect(endpoint)
            bound = endpoint

        replay = cfg.router_endpoint
        if replay is not None:
            router = ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.SNDHWM, cfg.hwm)
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.bind(replay)
            bound_replay = last_endpoint(router, replay)
    except BaseException:
        pub.close(linger=0)
        if router is not None:
            router.close(linger=0)
        raise
    return Sockets(pub, router, bound, bound_replay)


def last_endpoint(sock: zmq.Socket[Any], fallback: str) -> str:
    """The address a bind really got (port 0 / wildcard resolved)."""
    try:
        value = sock.getsockopt(zmq.LAST_ENDPOINT)
    except zmq.ZMQError:  # pragma: no cover
        return fallback
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text or fallback
