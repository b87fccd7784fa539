"""The mirror's wire protocol: what an engine's pool did, as sequenced messages.

An engine-side follower (the ``blockpool_vllm`` plugin) publishes, on one ZMQ
PUB socket, frames ``[TOPIC, payload, mac]`` where the payload is one msgpack
message below and ``mac`` its authentication (blockpool/mirror/auth.py;
empty without a shared secret); a mirror (``blockpool serve --mirror``)
subscribes and applies them to its own pool.  A snapshot is asked for on a
second socket (DEALER to the engine's ROUTER): the request is
``SnapshotRequest``, the reply a ``Snapshot``.

* ``Hello``: what the engine is (vLLM version, pool shape, hash function,
  groups, free order) and whether the follower can mirror it exactly (and
  if not, why).  Sent at start and every few seconds (late subscribers).
* ``Batch``: one scheduler step's pool operations, numbered: ``seq`` counts
  batches, ``first_op`` the operations before it (a mirror checks both for
  gaps), plus what happened to requests, the engine's prefix-cache totals,
  the batches dropped so far and the digest of the real pool after it.
* ``Batches``: several batches in one message, in order -- what an engine
  too busy to give the plugin's thread time of its own queued meanwhile
  (each socket call lets go of the interpreter, and a busy engine gives it
  back only after the switch interval: one call for many batches).
* ``Beat``: the engine is alive but idle (last seq and op count).
* ``Snapshot``: the whole pool after ``ops`` operations.

Every message of one run of the plugin carries its ``boot`` (a random id
drawn at start): a mirror drops whatever a previous engine left queued.

Operations and request records are typed records (msgspec structs encoded
as short arrays, their first item the tag): ``decode`` validates every
field, bounds every hash and id, and refuses deep nesting.  They hold no
cycles, so the garbage collector does not track them (``gc=False``): the
plugin makes thousands a second inside the engine's process.  Only block ids,
hashes and counts travel: no token ids, no text.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from blockpool.common.keys import GROUP_ID_BYTES, MAX_HASH_BYTES
from blockpool.runtime.ops.fields import BlockId  # the operations' own bound

PROTOCOL = 4  # 4: Batches
TOPIC = b"blockpool-mirror"
# Sizes in bytes, per message kind: a step's batch, a request to the control
# socket, a snapshot (only ever read from the engine's control socket).
MAX_BATCH_BYTES = 16 * 1024 * 1024
MAX_CONTROL_BYTES = 4096
MAX_SNAPSHOT_BYTES = 512 * 1024 * 1024
MAX_MESSAGE_BYTES = MAX_SNAPSHOT_BYTES

# a block hash (no group id); a map key: a hash and its group id
Hash = Annotated[bytes, Meta(min_length=1, max_length=MAX_HASH_BYTES)]
Key = Annotated[bytes, Meta(min_length=1, max_length=MAX_HASH_BYTES + GROUP_ID_BYTES)]
RequestId = Annotated[str, Meta(max_length=256)]
Count = Annotated[int, Meta(ge=0, le=2**62)]
Text = Annotated[str, Meta(max_length=2048)]
Boot = Annotated[str, Meta(max_length=64)]
# every float on the wire: finite (NaN fails any bound, infinities these), so
# nothing a peer sends makes a figure the service cannot write as JSON
Float = Annotated[float, Meta(ge=-1e15, le=1e15)]


# ----------------------------------------------------------------- operations


class Allocate(msgspec.Struct, tag="a", array_like=True, frozen=True, gc=False):
    """``get_new_blocks`` handed out these ids, in order."""

    ids: list[BlockId]


class Free(msgspec.Struct, tag="f", array_like=True, frozen=True, gc=False):
    """``free_blocks``, in the order given."""

    ids: list[BlockId]


class Touch(msgspec.Struct, tag="t", array_like=True, frozen=True, gc=False):
    ids: list[BlockId]


class Cache(msgspec.Struct, tag="c", array_like=True, frozen=True, gc=False):
    """``cache_full_blocks``: the blocks newly hashed, one hash each (without
    the group id), and the hash before the first (None: the first block)."""

    group: Annotated[int, Meta(ge=0, le=1024)]
    parent: Hash | None
    ids: list[BlockId]
    hashes: list[Hash]


class Evict(msgspec.Struct, tag="e", array_like=True, frozen=True, gc=False):
    ids: list[BlockId]


class Reset(msgspec.Struct, tag="r", array_like=True, frozen=True, gc=False):
    """A ``reset_prefix_cache`` that succeeded."""


class Unsupported(msgspec.Struct, tag="u", array_like=True, frozen=True, gc=False):
    """Something the mirror cannot follow happened to the pool."""

    what: Text


Op = Allocate | Free | Touch | Cache | Evict | Reset | Unsupported


# ------------------------------------------------------------ request records


class Arrive(msgspec.Struct, tag="arrive", array_like=True, frozen=True, gc=False):
    """A request reached the scheduler: its prompt length and block hashes.
    ``skips_cache``: the engine will not look its prompt up in the prefix
    cache (``prompt_logprobs``), so no block of it can hit."""

    rid: RequestId
    ts: Float
    prompt_tokens: Count
    hashes: list[Hash]
    skips_cache: bool = False


class Scheduled(msgspec.Struct, tag="scheduled", array_like=True, frozen=True, gc=False):
    """Its first scheduling, with the prefix hit it got."""

    rid: RequestId
    ts: Float
    hit_tokens: Count


class Preempted(msgspec.Struct, tag="preempted", array_like=True, frozen=True, gc=False):
    rid: RequestId
    ts: Float


class Finished(msgspec.Struct, tag="finished", array_like=True, frozen=True, gc=False):
    rid: RequestId
    ts: Float
    num_tokens: Count


Record = Arrive | Scheduled | Preempted | Finished

# the record kinds' names (their tags), as the request book says them
REQ_ARRIVE = "arrive"
REQ_SCHEDULED = "scheduled"
REQ_PREEMPTED = "preempted"
REQ_FINISHED = "finished"


# ------------------------------------------------------------------ messages


class Group(msgspec.Struct, frozen=True):
    group_id: Annotated[int, Meta(ge=0, le=1024)]
    kind: Text  # the KV-cache spec's class name (FullAttentionSpec, ...)
    block_size: Annotated[int, Meta(ge=1, le=1 << 20)]


class DigestReading(msgspec.Struct, frozen=True):
    """How far the plugin's digest is behind its engine.  The plugin reads
    vLLM's pool only while the engine's thread waits for a forward pass (or
    idles, blockpool_vllm/forward_pass.py): an engine that never waits --
    its scheduling longer than its passes -- gets no digest, and says so
    here rather than nothing."""

    behind: Count  # blocks batches named that the digest has not read yet
    sweep_left: Count | None = None  # a rebuild's rows still to read (None: none running)
    # the shortest of the engine's last forward passes (µs): the time the
    # plugin's thread has to read in; None: not known yet (too few passes)
    window_us: Annotated[float, Meta(ge=0, le=1e15)] | None = None
    taken: Count = 0  # digests taken since the plugin started
    # since the plugin started: readings the engine moved during (thrown
    # away, read again), and readings stopped at the forward pass's planned
    # end (what they read kept) -- None: a plugin that does not say
    discarded: Count | None = None
    stopped: Count | None = None
    # since the plugin started: of the readings thrown away, those still
    # running when the engine came back (its thread may have waited on the
    # plugin's for the GIL); and forward passes planned by the passes of as
    # many tokens that ended before that plan (each turns it off for a while)
    # -- None: a plugin that does not say
    overrun: Count | None = None
    planned_too_long: Count | None = None


class Hello(msgspec.Struct, tag="hello"):
    protocol: int
    engine_id: Text
    vllm_version: Text
    num_gpu_blocks: Annotated[int, Meta(ge=1, le=2**31 - 1)]
    block_size: Annotated[int, Meta(ge=1, le=1 << 20)]
    hash_block_size: Annotated[int, Meta(ge=1, le=1 << 20)]
    hash_fn: Text
    groups: Annotated[list[Group], Meta(max_length=64)]
    free_order: Text  # blockpool's name: append_all or uncached_first
    exact: bool  # False: ``problems`` says what the follower cannot mirror
    problems: Annotated[list[Text], Meta(max_length=64)]
    digest_every: Annotated[int, Meta(ge=1)]
    control_port: Annotated[int, Meta(ge=1, le=65535)] | None
    started_at: Float
    seq: Count  # the last batch sent
    model: Text | None = None  # the engine's (served) model name, where it says
    boot: Boot = ""  # this run of the plugin (see the module doc)
    authenticated: bool = False  # the engine signs its messages (a shared secret)
    restarts: Count = 0  # the sender thread's restarts after a failure
    bad_requests: Count = 0  # control requests refused (malformed, unsigned, stale)
    digest_scheme: Text = ""  # how its digests are computed (blockpool/mirror/digest.py)
    # the follower's time per step on the engine's thread: p50, p99, max (µs);
    # in the handshake too, which goes out every few seconds however busy the
    # engine is (a beat only when it is idle)
    cost_us: tuple[Float, Float, Float] | None = None
    reading: DigestReading | None = None  # the digest's progress (None: on the engine's thread)


class Digest(msgspec.Struct, frozen=True):
    ops: Count  # operations applied when it was taken
    value: Annotated[str, Meta(max_length=64)]


class Batch(msgspec.Struct, tag="batch", gc=False):
    seq: Count
    step: Count
    ts: Float
    first_op: Count
    ops: list[Op]
    requests: list[Record]
    stats: tuple[Count, Count, Count]  # prefix cache totals: requests, queries, hits
    drops: Count
    digest: Digest | None = None
    boot: Boot = ""


MAX_BATCHES_PER_MESSAGE = 256  # in one ``Batches``


class Batches(msgspec.Struct, tag="batches", gc=False):
    """Consecutive batches, in the order they were made (each one checked
    for gaps as if it came alone)."""

    batches: Annotated[list[Batch], Meta(min_length=1, max_length=MAX_BATCHES_PER_MESSAGE)]
    boot: Boot = ""


class _EncodedBatches(msgspec.Struct, tag="batches", gc=False):
    """A ``Batches`` of batches encoded already: the same bytes on the wire."""

    batches: list[msgspec.Raw]
    boot: Boot = ""


class Beat(msgspec.Struct, tag="beat"):
    seq: Count
    ts: Float
    ops: Count
    drops: Count
    stats: tuple[Count, Count, Count]
    steps: Count = 0  # batches timed so far (the plugin times one batch in 7)
    cost_ns: Count = 0  # the follower's own time on the engine's thread in them
    boot: Boot = ""
    # the follower's time per step on the engine's thread: p50, p99, max (µs)
    cost_us: tuple[Float, Float, Float] | None = None
    restarts: Count = 0
    bad_requests: Count = 0
    # the engine's newest digest and the batch boundary it is of (an idle
    # engine's proof; a busy one's rides on its batches)
    digest: Digest | None = None
    reading: DigestReading | None = None


class Snapshot(msgspec.Struct, tag="snapshot"):
    """The whole pool after ``ops`` operations.  Per block id (block 0, the
    null block, reads as free and unhashed): ``refs``, ``prev`` and ``next``
    are little-endian int32 arrays (the free queue as links: -1 the head or
    the tail, -2 not queued); ``key_lens`` one byte per block (0: no hash)
    and ``keys`` the keys so long, back to back.  ``dups``: keys held by
    more than one block, their blocks in the hash map's order.  ``digest``
    is the engine's digest of this state (blockpool/mirror/digest.py)."""

    ops: Count
    seq: Count  # the last batch enqueued before it
    ts: Float
    num_blocks: Annotated[int, Meta(ge=1, le=2**31 - 1)]
    refs: bytes
    prev: bytes
    next: bytes
    key_lens: bytes
    keys: bytes
    dups: list[tuple[Key, list[BlockId]]]
    stats: tuple[Count, Count, Count]
    problems: Annotated[list[Text], Meta(max_length=64)]
    digest: Annotated[str, Meta(max_length=64)] = ""
    boot: Boot = ""


class SnapshotRequest(msgspec.Struct, tag="snapshot?"):
    reason: Annotated[str, Meta(max_length=200)] = ""
    ts: Float = 0.0  # when asked (a signed request older than a minute is refused)
    nonce: Annotated[bytes, Meta(max_length=32)] = b""  # the reply's signature covers it


Message = Hello | Batch | Batches | Beat | Snapshot | SnapshotRequest

_ENCODER = msgspec.msgpack.Encoder()
# any one record's bytes as a message carries them (the plugin's sender encodes
# each operation as it reads it, blockpool_vllm/call_records.py: a bound
# method, no Python call between)
encode_record = _ENCODER.encode
_DECODER = msgspec.msgpack.Decoder(Message)


class ProtocolError(ValueError):
    """A message that is not one of the protocol's."""


def encode(msg: Message) -> bytes:
    return _ENCODER.encode(msg)


def batches_of(msg: Message) -> list[Batch]:
    """The batches a message carries, in order: a ``Batch`` itself, a
    ``Batches`` its own; none in any other."""
    if isinstance(msg, Batch):
        return [msg]
    return msg.batches if isinstance(msg, Batches) else []


def encode_batches(encoded: list[bytes], boot: str) -> bytes:
    """A ``Batches`` message of batches each ``encode``-d already (the
    plugin's sender holds bytes while it gathers them, not records: records
    held a while are the garbage collector's work, measured)."""
    return _ENCODER.encode(_EncodedBatches([msgspec.Raw(e) for e in encoded], boot))


def decode(data: bytes, limit: int = MAX_MESSAGE_BYTES) -> Message:
    """One message, validated; ProtocolError naming what is wrong (too
    large, nested too deep, not one of the protocol's messages)."""
    if len(data) > limit:
        raise ProtocolError(f"message of {len(data)} bytes, the limit is {limit}")
    try:
        msg: Message = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"not a mirror message: {str(exc)[:300]}") from None
    except RecursionError:
        raise ProtocolError("not a mirror message: nested too deep") from None
    return msg
