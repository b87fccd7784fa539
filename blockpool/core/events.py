"""KV-cache events, as vLLM 0.16 emits and ships them.

The structs are msgspec ``array_like`` + ``tag=True``: on the wire (vLLM's ZMQ
KV-event stream) an event is a positional msgpack array starting with its
class name, and a batch is ``[ts, [event, ...], data_parallel_rank]`` (a rank of
None is sent as nil: array-like structs keep every field, as in vLLM).  Class
and field names, field order and options match vLLM so that its subscribers
decode what we publish.
"""

from __future__ import annotations

from typing import Any

import msgspec

from blockpool.core.hashing import ExternalBlockHash

MEDIUM_GPU = "GPU"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class of the KV-cache events."""


class BlockStored(KVCacheEvent):
    """Blocks entered the prefix cache (one event per cache_full_blocks call)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None

    def __hash__(self) -> int:
        return hash(
            (
                tuple(self.block_hashes),
                self.parent_block_hash,
                tuple(self.token_ids),
                self.block_size,
                self.lora_id,
                self.medium,
            )
        )


class BlockRemoved(KVCacheEvent):
    """A block left the prefix cache (evicted)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.medium))


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


AnyKVEvent = BlockStored | BlockRemoved | AllBlocksCleared

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_event_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload vLLM 0.16 puts in a KV-event message."""
    return _encoder.encode(batch)


def decode_event_batch(payload: bytes) -> KVEventBatch:
    """Decode vLLM 0.16's positional form (strict: what we encode)."""
    return _decoder.decode(payload)
