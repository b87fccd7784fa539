"""KV events as the observer reads them, whichever publisher sent them:
one form for BlockStored, BlockRemoved and AllBlocksCleared, and the batch
with what it could not read counted."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from blockpool.kvevents.hashes import Hash

Encoding = Literal["positional", "map"]


class StoredEvent(msgspec.Struct, gc=False):
    hashes: list[Hash]
    parent: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra: dict[str, Any] | None = None
    group: int | None = None  # group_idx (None: the publisher has no groups)
    spec_kind: str | None = None  # kv_cache_spec_kind, e.g. "full_attention"
    sliding_window: int | None = None  # kv_cache_spec_sliding_window


class RemovedEvent(msgspec.Struct, gc=False):
    hashes: list[Hash]
    medium: str | None = None
    extra: dict[str, Any] | None = None
    group: int | None = None


class ClearedEvent(msgspec.Struct, gc=False):
    medium: str | None = None
    extra: dict[str, Any] | None = None


ObservedEvent = StoredEvent | RemovedEvent | ClearedEvent


class ObservedBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[ObservedEvent]
    data_parallel_rank: int | None
    encoding: Encoding
    unknown: int = 0  # events of a type we do not know (skipped)
    malformed: int = 0  # events we could not read (skipped)
    # poison found in the batch, by kind: malformed_event, bad_number (a
    # skipped event), non_finite_ts (ts then 0.0), extra_cut (extra trimmed)
    issues: dict[str, int] | None = None
    unknown_fields: dict[str, int] | None = None  # field name -> times seen (kept)
