"""Endpoints and options of the KV-event stream, as vLLM 0.16 names them.

``KVEventsConfig`` carries the fields of vLLM's ``KVEventsConfig`` that shape
the ZMQ publisher (endpoint, replay_endpoint, buffer_steps, hwm,
max_queue_size, topic) plus the data-parallel rank the publisher serves.
vLLM offsets both ports by the rank (``offset_endpoint_port``): rank 2 of
``tcp://*:5557`` publishes on ``tcp://*:5559``.  ``plan_sources`` does the same
expansion for an observer given ``--dp-size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay stream's last message carries this sequence and an empty payload."""

BindMode = Literal["auto", "bind", "connect"]
EventsFormat = Literal["v016", "map"]
"""``v016``: vLLM 0.16's positional events; ``map``: the current vLLM's
map-tagged events (``wire_format.py``)."""


@dataclass(frozen=True)
class KVEventsConfig:
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    data_parallel_rank: int = 0
    # "auto" is vLLM's rule: bind a wildcard/ipc/inproc address, connect to
    # any other.  "bind" binds a concrete address (tcp://127.0.0.1:5557).
    bind: BindMode = "auto"
    events_format: EventsFormat = "v016"

    def __post_init__(self) -> None:
        if self.events_format not in ("v016", "map"):
            raise ValueError(f"events_format must be 'v016' or 'map', not {self.events_format!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.data_parallel_rank < 0:
            raise ValueError("data_parallel_rank must be >= 0")
        check_endpoint(self.endpoint)
        if self.replay_endpoint is not None:
            check_endpoint(self.replay_endpoint)

    @property
    def pub_endpoint(self) -> str:
        """The PUB address after the rank's port offset."""
        return offset_endpoint_port(self.endpoint, self.data_parallel_rank)

    @property
    def router_endpoint(self) -> str | None:
        """The ROUTER (replay) address after the rank's port offset."""
        if self.replay_endpoint is None:
            return None
        return offset_endpoint_port(self.replay_endpoint, self.data_parallel_rank)

    def binds(self) -> bool:
        """Whether the PUB socket binds (else it connects to a subscriber)."""
        if self.bind != "auto":
            return self.bind == "bind"
        return vllm_binds(self.pub_endpoint)

    @property
    def mode(self) -> Literal["bind", "connect"]:
        """What the PUB socket does with ``pub_endpoint``."""
        return "bind" if self.binds() else "connect"


def vllm_binds(endpoint: str) -> bool:
    """vLLM's rule for the PUB socket: bind stable (wildcard, ipc, inproc)
    addresses, connect to concrete ones."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith("ipc://")
        or endpoint.startswith("inproc://")
    )


def check_endpoint(endpoint: str) -> None:
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(f"endpoint {endpoint!r} must start with tcp://, ipc:// or inproc://")
    if endpoint.startswith("tcp://") and not endpoint.endswith(":*"):
        _port_of(endpoint)  # tcp://host:* binds any free port


def _port_of(endpoint: str) -> int:
    head, sep, tail = endpoint.rpartition(":")
    if not sep or not tail.isdigit() or head in ("tcp", "tcp:/"):
        raise ValueError(f"endpoint {endpoint!r} needs a port (tcp://host:port)")
    port = int(tail)
    if port == 0:
        raise ValueError(f"endpoint {endpoint!r}: port 0 (use * for any free port)")
    if not 0 < port < 65536:
        raise ValueError(f"endpoint {endpoint!r}: port {port} is out of range")
    return port


def offset_endpoint_port(endpoint: str, data_parallel_rank: int) -> str:
    """The endpoint data-parallel rank ``data_parallel_rank`` uses, as vLLM
    derives it: tcp ports move up by the rank, inproc names get ``_dp<rank>``,
    rank 0 keeps the endpoint unchanged."""
    if data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        port = _port_of(endpoint)
        base = endpoint[: endpoint.rfind(":")]
        return f"{base}:{port + data_parallel_rank}"
    raise ValueError(f"endpoint {endpoint!r}: only tcp and inproc endpoints take a rank offset")


@dataclass(frozen=True)
class SourceSpec:
    """One stream an observer follows: an instance, or one DP rank of one."""

    name: str
    endpoint: str
    replay_endpoint: str | None
    data_parallel_rank: int
    bind: bool = False  # the observer binds ``endpoint`` and the publisher connects to it


def default_name(endpoint: str) -> str:
    """host:port for tcp, the path for ipc."""
    parts = urlsplit(endpoint)
    if parts.scheme == "tcp" and parts.netloc:
        return parts.netloc
    return endpoint.split("://", 1)[-1]


def _bind_name(endpoint: str) -> str:
    """host:port of an address the observer binds (``*`` reads ``any``)."""
    return default_name(endpoint).replace("*", "any").replace("[", "").replace("]", "")


def plan_sources(
    endpoints: list[str],
    replays: list[str | None] | None = None,
    dp_size: int = 1,
    binds: list[str] | None = None,
) -> list[SourceSpec]:
    """Expand the command line's endpoints into the streams to follow.

    ``endpoints`` may be ``name=tcp://host:port``; ``replays`` is empty or has
    one entry per endpoint (None: that one has no replay socket); with
    ``dp_size`` N each endpoint (and its replay) becomes N ranks on N
    consecutive ports, as vLLM's publishers bind them.  ``binds`` are
    addresses the observer binds (``[name=]tcp://host:port``) for publishers
    that connect -- vLLM does when its endpoint is a concrete host; they
    follow ``endpoints`` in the order ``replays`` are matched.
    """
    binds = list(binds or [])
    if not endpoints and not binds:
        raise ValueError("give at least one endpoint to observe (or one to --bind)")
    if dp_size < 1:
        raise ValueError("dp_size must be >= 1")
    replays = list(replays or [])
    if replays and len(replays) != len(endpoints) + len(binds):
        raise ValueError(
            f"{len(replays)} replay endpoint(s) for {len(endpoints) + len(binds)} endpoint(s): "
            "give one per endpoint (use 'none' for an endpoint without replay) or none at all"
            + (" -- the endpoints first, then the --bind ones" if binds else "")
        )
    out: list[SourceSpec] = []
    given = [(raw, False) for raw in endpoints] + [(raw, True) for raw in binds]
    for i, (raw, bind) in enumerate(given):
        name, sep, endpoint = raw.partition("=")
        if not sep:
            name, endpoint = "", raw
        name = name.strip()
        endpoint = endpoint.strip()
        check_endpoint(endpoint)
        if bind:
            if endpoint.endswith(":*"):
                raise ValueError(f"--bind {endpoint!r}: give the port the publishers connect to")
        elif "*" in endpoint:
            raise ValueError(
                f"endpoint {endpoint!r}: an observer connects to it; give a host, not * "
                "(or --bind it, for publishers that connect)"
            )
        replay = replays[i] if replays else None
        if replay is not None:
            replay = replay.strip()
            if replay.lower() in ("", "none", "-"):
                replay = None
            else:
                check_endpoint(replay)
        for rank in range(dp_size):
            ep = offset_endpoint_port(endpoint, rank)
            rp = offset_endpoint_port(replay, rank) if replay else None
            if name:
                label = name if dp_size == 1 else f"{name}-dp{rank}"
            else:
                label = _bind_name(ep) if bind else default_name(ep)
            out.append(SourceSpec(label, ep, rp, rank, bind))
    for s in out:
        if not s.name or any(not (c.isalnum() or c in "._:-") for c in s.name):
            raise ValueError(f"instance name {s.name!r}: use letters, digits and . _ : -")
    eps = [s.endpoint for s in out]
    dup_eps = sorted({e for e in eps if eps.count(e) > 1})
    if dup_eps:
        raise ValueError(f"endpoints observed twice: {', '.join(dup_eps)}")
    names = [s.name for s in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"instance names must be unique: {', '.join(dupes)}")
    return out
