"""The two payload forms the publisher can send (``--kv-events-format``).

``"v016"`` (default)
    vLLM 0.16.0's: positional arrays, ``blockpool.encode_event_batch``.
``"map"``
    the current vLLM's (0.24 on; checked against 0.33.0's
    ``vllm/distributed/kv_events.py``): the batch is still the positional
    ``[ts, [event, ...], data_parallel_rank]`` but each event is a map tagged
    by ``"type"`` (the class name), with the fields in vLLM's order and every
    optional field left out when it has no value:

    ``BlockStored``: block_hashes, parent_block_hash, token_ids, block_size,
    lora_id, medium, lora_name, then when known extra_keys (one entry per
    block), group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window.
    ``BlockRemoved``: block_hashes, medium, group_idx.  ``AllBlocksCleared``:
    the tag alone.

What our events cannot say: the pool's events are vLLM 0.16's, which carry
neither the KV-cache group nor the extra keys.  ``group_idx`` is therefore
given only when the pool has one group (0), and ``extra_keys`` is left out
(a consumer reads "not said", not "none").  Every group of our pool is full
attention: ``kv_cache_spec_kind`` is ``"full_attention"`` on stores, no
sliding window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from blockpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

FULL_ATTENTION: Final = "full_attention"


class _MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type", tag=True):
    pass


class _Stored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    # vLLM 0.33's later fields, never set here: declared so that the map's
    # header is the one vLLM's encoder writes (the bytes are vLLM's)
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class _Removed(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _Cleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()


def to_map_event(ev: KVCacheEvent, group_idx: int | None) -> _Stored | _Removed | _Cleared:
    """One of our events in the map-tagged form."""
    if isinstance(ev, BlockStored):
        return _Stored(
            block_hashes=list(ev.block_hashes),
            parent_block_hash=ev.parent_block_hash,
            token_ids=list(ev.token_ids),
            block_size=ev.block_size,
            lora_id=ev.lora_id,
            medium=ev.medium,
            lora_name=ev.lora_name,
            group_idx=group_idx,
            kv_cache_spec_kind=FULL_ATTENTION,
        )
    if isinstance(ev, BlockRemoved):
        return _Removed(block_hashes=list(ev.block_hashes), medium=ev.medium, group_idx=group_idx)
    if isinstance(ev, AllBlocksCleared):
        return _Cleared()
    raise TypeError(f"not a KV-cache event: {type(ev).__name__}")


def encode_map_batch(
    ts: float,
    events: Sequence[KVCacheEvent],
    data_parallel_rank: int | None,
    group_idx: int | None,
) -> bytes:
    """The msgpack payload of one batch in the map-tagged form."""
    return _encoder.encode(
        _Batch(ts, [to_map_event(ev, group_idx) for ev in events], data_parallel_rank)
    )
