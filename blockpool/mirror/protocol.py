"""The mirror's wire protocol: what an engine's pool did, as sequenced messages.

An engine-side follower (the ``blockpool_vllm`` plugin) publishes, on one ZMQ
PUB socket, frames ``[TOPIC, payload]`` where the payload is one msgpack
message below; a mirror (``blockpool serve --mirror``) subscribes and applies
them to its own pool.  A snapshot is asked for on a second socket (REQ/REP):
the request is ``SnapshotRequest``, the reply a ``Snapshot``.

* ``Hello``: what the engine is (vLLM version, pool shape, hash function,
  groups, free order) and whether the follower can mirror it exactly (and
  if not, why).  Sent at start and every few seconds (late subscribers).
* ``Batch``: one scheduler step's pool operations, numbered: ``seq`` counts
  batches, ``first_op`` the operations before it (a mirror checks both for
  gaps), plus what happened to requests, the engine's prefix-cache totals,
  the batches dropped so far and, every few steps, a digest of the real pool.
* ``Beat``: the engine is alive but idle (last seq and op count).
* ``Snapshot``: the whole pool after ``op`` operations.

Operations are short lists, the first item naming them (``OP_*``); only
block ids, hashes and counts travel: no token ids, no text.
"""

from __future__ import annotations

from typing import Any

import msgspec

PROTOCOL = 1
TOPIC = b"blockpool-mirror"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a snapshot of a few million blocks fits

# Operations: [name, ...]
OP_ALLOCATE = "a"  # ["a", [ids]]                the ids get_new_blocks handed out
OP_FREE = "f"  # ["f", [ids]]                    free_blocks, in the order given
OP_TOUCH = "t"  # ["t", [ids]]
OP_CACHE = "c"  # ["c", group, parent|None, [ids], [hashes]]   hashes without the group
OP_EVICT = "e"  # ["e", [ids]]                   evict_blocks
OP_RESET = "r"  # ["r"]                          a reset that succeeded
OP_UNSUPPORTED = "u"  # ["u", what]              something the mirror cannot follow

# Request records: [kind, request_id, ts, ...]
REQ_ARRIVE = "arrive"  # [.., prompt_tokens, [block hashes]]
REQ_SCHEDULED = "scheduled"  # [.., hit_tokens]     its first scheduling (the prefix hit)
REQ_PREEMPTED = "preempted"  # [..]
REQ_FINISHED = "finished"  # [.., num_tokens]


class Group(msgspec.Struct, frozen=True):
    group_id: int
    kind: str  # the KV-cache spec's class name (FullAttentionSpec, ...)
    block_size: int


class Hello(msgspec.Struct, tag="hello"):
    protocol: int
    engine_id: str
    vllm_version: str
    num_gpu_blocks: int
    block_size: int
    hash_block_size: int
    hash_fn: str
    groups: list[Group]
    free_order: str  # blockpool's name: append_all or uncached_first
    exact: bool  # False: ``problems`` says what the follower cannot mirror
    problems: list[str]
    digest_every: int
    control_port: int | None
    started_at: float
    seq: int  # the last batch sent
    model: str | None = None  # the engine's (served) model name, where it says


class Digest(msgspec.Struct, frozen=True):
    ops: int  # operations applied when it was taken
    value: str


class Batch(msgspec.Struct, tag="batch"):
    seq: int
    step: int
    ts: float
    first_op: int
    ops: list[list[Any]]
    requests: list[list[Any]]
    stats: tuple[int, int, int]  # prefix cache totals: requests, queries, hits
    drops: int
    digest: Digest | None = None


class Beat(msgspec.Struct, tag="beat"):
    seq: int
    ts: float
    ops: int
    drops: int
    stats: tuple[int, int, int]
    steps: int = 0  # batches made so far
    cost_ns: int = 0  # the follower's own time on the engine's thread so far


class Snapshot(msgspec.Struct, tag="snapshot"):
    ops: int  # operations applied before it was taken
    seq: int  # the last batch enqueued before it
    ts: float
    refs: list[int]  # per block id
    keys: list[bytes | None]  # per block id: hash + 4-byte group id
    queue: list[int]  # free block ids, head first
    entries: list[tuple[bytes, list[int]]]  # the hash map in order: key, its blocks
    stats: tuple[int, int, int]
    problems: list[str]


class SnapshotRequest(msgspec.Struct, tag="snapshot?"):
    reason: str = ""


Message = Hello | Batch | Beat | Snapshot | SnapshotRequest

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Message)


class ProtocolError(ValueError):
    """A message that is not one of the protocol's."""


def encode(msg: Message) -> bytes:
    return _ENCODER.encode(msg)


def decode(data: bytes) -> Message:
    """One message, validated; ProtocolError naming what is wrong."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes, the limit is {MAX_MESSAGE_BYTES}")
    try:
        msg: Message = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"not a mirror message: {exc}") from None
    return msg
