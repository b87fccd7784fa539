"""Mirror an engine's pool: the wire protocol, the pool reader, the applier.

The engine side (``blockpool_vllm``) follows a vLLM engine's block pool and
publishes what it did; ``MirrorApplier`` applies it to a PoolRuntime and
proves the two equal by digest (docs: README, "Watch your vLLM").
"""

from __future__ import annotations

from blockpool.mirror.apply import Applied, Divergence, Gap, MirrorApplier
from blockpool.mirror.digest import PoolDigest, pool_digest
from blockpool.mirror.poolview import snapshot_digest, snapshot_of
from blockpool.mirror.protocol import (
    PROTOCOL,
    TOPIC,
    Batch,
    Batches,
    Beat,
    Digest,
    Group,
    Hello,
    ProtocolError,
    Snapshot,
    SnapshotRequest,
    decode,
    encode,
)

__all__ = [
    "PROTOCOL",
    "TOPIC",
    "Applied",
    "Batch",
    "Batches",
    "Beat",
    "Digest",
    "Divergence",
    "Gap",
    "Group",
    "Hello",
    "MirrorApplier",
    "PoolDigest",
    "ProtocolError",
    "Snapshot",
    "SnapshotRequest",
    "decode",
    "encode",
    "pool_digest",
    "snapshot_digest",
    "snapshot_of",
]
