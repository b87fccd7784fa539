"""The JSON form of an observed event, as the observer's REST and websocket
views show it (hashes as hex strings, at most 256 token ids)."""

from __future__ import annotations

from typing import Any

from blockpool.kvevents.hashes import hash_hex
from blockpool.kvevents.observed import ClearedEvent, ObservedEvent, RemovedEvent, StoredEvent

EventItem = tuple[int, ObservedEvent]  # (publisher batch seq, event)


def event_json(seq: int, ts: float, item: EventItem) -> dict[str, Any]:
    batch_seq, ev = item
    out: dict[str, Any] = {"seq": seq, "batch_seq": batch_seq, "ts": ts}
    if isinstance(ev, StoredEvent):
        out.update(
            type="BlockStored",
            block_hashes=[hash_hex(h) for h in ev.hashes],
            parent_block_hash=None if ev.parent is None else hash_hex(ev.parent),
            token_ids=ev.token_ids[:256],
            num_tokens=len(ev.token_ids),
            block_size=ev.block_size,
            lora_id=ev.lora_id,
            lora_name=ev.lora_name,
            medium=ev.medium,
        )
    elif isinstance(ev, RemovedEvent):
        out.update(
            type="BlockRemoved", block_hashes=[hash_hex(h) for h in ev.hashes], medium=ev.medium
        )
    else:
        out.update(type="AllBlocksCleared", medium=ev.medium)
    if not isinstance(ev, ClearedEvent) and ev.group is not None:
        out["group_idx"] = ev.group
    if isinstance(ev, StoredEvent) and ev.spec_kind is not None:
        out["kv_cache_spec_kind"] = ev.spec_kind
        out["kv_cache_spec_sliding_window"] = ev.sliding_window
    if ev.extra:
        out["extra"] = {k: _jsonable(v) for k, v in ev.extra.items()}
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, int | float | str | bool) or v is None:
        return v
    return repr(v)
