"""How a fleet's router picks the replica of each request.

Each router sees the replicas through :class:`ReplicaView`: the real pool
of each (``cached_blocks``: the prefix of the request's hash chain that a
lookup on that pool would hit now, the exact state, not an index like
llm-d's approximate one) and its load.

Load, the same figure for every router that uses one:

- timed mode: the replica's blocks in use (held by running requests) plus the
  prompt blocks of the requests waiting on it -- Dynamo's "active blocks"
  (``docs/sizing.md``); ``least_loaded`` looks first at in-flight requests
  (running + waiting), then at those blocks;
- sequence mode: nothing is in flight (each request is freed before the next
  is looked up), so the load is the prompt blocks routed to the replica so
  far beyond those of the least-routed replica: the backlog it would have if
  every replica drained at the same rate.

Routers (ties: the lower load, then the lower replica index):

``round_robin``
    request ``i`` to replica ``i mod N`` (in arrival order).
``session``
    affinity on a session key: the request's LoRA name, cache salt and first
    ``session_ids`` hash ids (Mooncake; a recording's first
    ``session_ids x tokens_per_id`` prompt tokens) -- a conversation's turns
    share them -- mapped to a replica by a stable hash (BLAKE2b of the key, mod
    N), as a consistent-hash load balancer keyed on a session header does.
    A trace has no session field of its own, so the key is derived.
``least_loaded``
    the replica with the fewest in-flight requests (timed) / the lowest load
    (sequence).
``prefix_aware``
    the lowest cost ``overlap_weight x (P - overlap) + load`` with ``P`` the
    request's prompt blocks and ``overlap`` the blocks of its prefix cached on
    the replica: NVIDIA Dynamo's KV router cost (``cost =
    overlap_score_weight x prefill_blocks + decode_blocks``, weight 1.0 by
    default, ``--router-kv-overlap-score-weight``).  llm-d's scheduler adds a
    prefix-cache scorer (matched blocks / prompt blocks) and a queue or
    load scorer with weights (3 and 2 in its default profile); both trade a
    cache hit against load the same way, Dynamo's in blocks.

References (behaviour followed, no code): Dynamo's router docs, "Routing
Concepts" (docs.nvidia.com/dynamo/latest/components/router/routing-concepts:
the cost above, lowest wins, ``router_temperature`` 0 = deterministic) and
the frontend reference (``--router-kv-overlap-score-weight``, default 1.0);
its design doc counts prefill blocks as "input tokens - overlap blocks x
block size" over the block size, as ``P - overlap`` does here.
gateway-api-inference-extension's prefix plugin
(``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go``: the longest
matched prefix of block hashes per server, scored matched / total blocks)
and llm-d's default scheduling profile (prefix-cache scorer weight 3, queue
scorer weight 2: Red Hat OpenShift AI 3.4, "Configuring scheduler settings").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from blockpool.core.hashing import BlockHash
from blockpool.core.pool import BlockPool
from blockpool.trace.workload.reader import Trace, TraceRequest

ROUTERS = ("round_robin", "session", "prefix_aware", "least_loaded")
DEFAULT_OVERLAP_WEIGHT = 1.0  # Dynamo's --router-kv-overlap-score-weight default
DEFAULT_SESSION_IDS = 1


class ReplicaView(Protocol):
    """What a router may look at on one replica."""

    def cached_blocks(self, hashes: Sequence[BlockHash], max_hit: int) -> int:
        """Leading blocks of ``hashes[:max_hit]`` cached on this replica now."""
        ...

    @property
    def load_blocks(self) -> int: ...

    @property
    def in_flight(self) -> int: ...


_ONE_GROUP = [0]  # a fleet replica's pool has one KV-cache group


def cached_prefix(pool: BlockPool, hashes: Sequence[BlockHash], max_hit: int) -> int:
    """Leading blocks of ``hashes[:max_hit]`` cached in ``pool`` now (one
    group: a replica's ``cached_blocks``)."""
    get = pool.get_cached_block
    gids = _ONE_GROUP
    k = 0
    while k < max_hit and get(hashes[k], gids) is not None:
        k += 1
    return k


class Router:
    """Base: ``route`` returns the index of the replica for one request."""

    name = ""

    def route(
        self,
        req: TraceRequest,
        hashes: Sequence[BlockHash],
        max_hit: int,
        prompt_blocks: int,
        replicas: Sequence[ReplicaView],
    ) -> int:
        raise NotImplementedError


def _least(replicas: Sequence[ReplicaView], key: list[float]) -> int:
    """The replica of the lowest ``key``, then of the lowest load, then the first."""
    return min(range(len(replicas)), key=lambda j: (key[j], replicas[j].load_blocks, j))


class ReplicasOnlyRouter(Router):
    """Base of a router that looks at the replicas alone, not the request:
    ``route`` is ``pick(replicas)``."""

    def route(
        self,
        req: TraceRequest,  # noqa: ARG002 the Router protocol
        hashes: Sequence[BlockHash],  # noqa: ARG002 the Router protocol
        max_hit: int,  # noqa: ARG002 the Router protocol
        prompt_blocks: int,  # noqa: ARG002 the Router protocol
        replicas: Sequence[ReplicaView],
    ) -> int:
        return self.pick(replicas)

    def pick(self, replicas: Sequence[ReplicaView]) -> int:
        raise NotImplementedError


class RoundRobin(ReplicasOnlyRouter):
    name = "round_robin"

    def __init__(self) -> None:
        self.next = 0

    def pick(self, replicas: Sequence[ReplicaView]) -> int:
        j = self.next % len(replicas)
        self.next = j + 1
        return j


def session_key(trace: Trace, req: TraceRequest, session_ids: int) -> bytes:
    """The bytes a session router hashes for ``req`` (see the module doc)."""
    if req.token_ids is not None:
        head: tuple[int, ...] = req.token_ids[: session_ids * trace.tokens_per_id]
    else:
        head = req.hash_ids[:session_ids]
    tag = f"{req.lora_name or ''}\x00{req.cache_salt or ''}\x00"
    return tag.encode() + b",".join(str(v).encode() for v in head)


class Session(Router):
    name = "session"

    def __init__(self, trace: Trace, session_ids: int = DEFAULT_SESSION_IDS) -> None:
        if session_ids < 1:
            raise ValueError(f"session_ids must be >= 1, got {session_ids}")
        self.trace = trace
        self.session_ids = session_ids

    def route(
        self,
        req: TraceRequest,
        hashes: Sequence[BlockHash],  # noqa: ARG002 the Router protocol
        max_hit: int,  # noqa: ARG002 the Router protocol
        prompt_blocks: int,  # noqa: ARG002 the Router protocol
        replicas: Sequence[ReplicaView],
    ) -> int:
        key = session_key(self.trace, req, self.session_ids)
        digest = hashlib.blake2b(key, digest_size=8).digest()
        return int.from_bytes(digest, "big") % len(replicas)


class LeastLoaded(ReplicasOnlyRouter):
    name = "least_loaded"

    def pick(self, replicas: Sequence[ReplicaView]) -> int:
        return _least(replicas, [float(r.in_flight) for r in replicas])


class PrefixAware(Router):
    name = "prefix_aware"

    def __init__(self, overlap_weight: float = DEFAULT_OVERLAP_WEIGHT) -> None:
        if not overlap_weight >= 0:
            raise ValueError(f"overlap weight must be >= 0, got {overlap_weight!r}")
        self.weight = overlap_weight

    def route(
        self,
        req: TraceRequest,  # noqa: ARG002 the Router protocol
        hashes: Sequence[BlockHash],
        max_hit: int,
        prompt_blocks: int,
        replicas: Sequence[ReplicaView],
    ) -> int:
        w = self.weight
        cost = [
            w * (prompt_blocks - r.cached_blocks(hashes, max_hit)) + r.load_blocks for r in replicas
        ]
        return _least(replicas, cost)


def make_router(
    name: str,
    trace: Trace,
    *,
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT,
    session_ids: int = DEFAULT_SESSION_IDS,
) -> Router:
    """A fresh router (routers keep state: one per replay)."""
    if name == "round_robin":
        return RoundRobin()
    if name == "session":
        return Session(trace, session_ids)
    if name == "least_loaded":
        return LeastLoaded()
    if name == "prefix_aware":
        return PrefixAware(overlap_weight)
    raise ValueError(f"unknown router {name!r} (known: {', '.join(ROUTERS)})")


def parse_routers(text: str) -> list[str]:
    """``"round_robin,prefix_aware"`` -> the names (ValueError naming a bad one)."""
    out: list[str] = []
    for part in text.split(","):
        p = part.strip()
        if not p:
            continue
        if p not in ROUTERS:
            raise ValueError(f"unknown router {p!r} (known: {', '.join(ROUTERS)})")
        if p not in out:
            out.append(p)
    if not out:
        raise ValueError("no router given")
    return out
