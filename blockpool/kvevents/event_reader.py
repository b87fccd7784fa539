"""One KV event read from its positional or map-tagged form: the tag, the
fields by position or name (aliases too), each checked; fields it does not
know kept as ``extra`` (``extra.py``)."""

from __future__ import annotations

import math
from typing import Any

from blockpool.core.events import BlockStored
from blockpool.kvevents.extra import (
    EXTRA_MAX_ITEMS,
    GROUP_FIELDS,
    KNOWN_KEPT,
    Tally,
    field_name,
    safe,
)
from blockpool.kvevents.hashes import Hash, norm_hash
from blockpool.kvevents.observed import ClearedEvent, ObservedEvent, RemovedEvent, StoredEvent

MAX_GROUP_IDX = 255  # KV-cache groups per model (vLLM has a handful)
_TAG_KEYS = ("type", "event_type", "kind", "tag")


_STORED = "blockstored"
_REMOVED = "blockremoved"
_CLEARED = "allblockscleared"
_STORED_FIELDS: tuple[str, ...] = BlockStored.__struct_fields__  # vLLM 0.16's positional order
_STORED_MAP_FIELDS = _STORED_FIELDS + GROUP_FIELDS
_REMOVED_FIELDS = ("block_hashes", "medium")
_REMOVED_MAP_FIELDS = (*_REMOVED_FIELDS, "group_idx")
_CLEARED_FIELDS: tuple[str, ...] = ()
_ALIASES = {
    "hashes": "block_hashes",
    "parent_hash": "parent_block_hash",
    "tokens": "token_ids",
    "token_id": "token_ids",
}


def _tag(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise TypeError("event tag is not a string")
    return "".join(ch for ch in value.lower() if ch.isalnum())


def _hashes(value: Any) -> list[Hash]:
    if isinstance(value, list | tuple):
        return [norm_hash(v) for v in value]
    if value is None:
        return []
    return [norm_hash(value)]


class BadNumber(ValueError):
    """A number that cannot be what the field holds (inf, NaN, a fraction)."""


def _token(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        raise BadNumber(f"token id {value!r} is not an integer")
    raise TypeError("a token id is not a number")


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("expected an int")
    return value


def _short_str(value: Any) -> str | None:
    text = _opt_str(value)
    return None if text is None else text[:64]


def _opt_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _fields(
    raw: Any, names: tuple[str, ...], tally: Tally, map_names: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(known fields by name, extra fields) of a positional or map event."""
    if isinstance(raw, dict):
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        wanted = map_names or names
        for k, v in raw.items():
            key = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
            if key in _TAG_KEYS:
                continue
            key = _ALIASES.get(key, key)
            if key in wanted:
                known[key] = v
                continue
            if key not in KNOWN_KEPT:
                tally.unknown(field_name(key))
            if len(extra) < EXTRA_MAX_ITEMS:
                extra[field_name(key)] = safe(v, tally)
            else:
                tally.cut += 1
        return known, extra or None
    values = list(raw[1:])
    known = dict(zip(names, values, strict=False))
    rest = values[len(names) :]
    if rest:
        tally.unknown("positional", len(rest))
    return known, ({"positional": safe(rest, tally)} if rest else None)


def _group(value: Any) -> int | None:
    group = _opt_int(value)
    if group is not None and not 0 <= group <= MAX_GROUP_IDX:
        raise BadNumber(f"group_idx {group} is outside 0..{MAX_GROUP_IDX}")
    return group


def read_event(raw: Any, tally: Tally) -> ObservedEvent | None:
    """One event, or None for a type we do not know."""
    if isinstance(raw, dict):
        tag_value = next((raw[k] for k in _TAG_KEYS if k in raw), None)
        if tag_value is None:
            raise TypeError("map event without a type field")
        tag = _tag(tag_value)
    elif isinstance(raw, list | tuple) and raw:
        tag = _tag(raw[0])
    else:
        raise TypeError("event is neither an array nor a map")
    if tag == _STORED:
        f, extra = _fields(raw, _STORED_FIELDS, tally, _STORED_MAP_FIELDS)
        hashes = _hashes(f.get("block_hashes"))
        tokens_raw = f.get("token_ids") or []
        if not isinstance(tokens_raw, list | tuple):
            raise TypeError("token_ids is not a list")
        tokens = [_token(t) for t in tokens_raw]
        size = _opt_int(f.get("block_size"))
        if size is None or size <= 0:
            size = len(tokens) // len(hashes) if hashes and tokens else 0
        parent = f.get("parent_block_hash")
        return StoredEvent(
            hashes=hashes,
            parent=None if parent is None else norm_hash(parent),
            token_ids=tokens,
            block_size=size,
            lora_id=_opt_int(f.get("lora_id")),
            medium=_opt_str(f.get("medium")),
            lora_name=_opt_str(f.get("lora_name")),
            extra=extra,
            group=_group(f.get("group_idx")),
            spec_kind=_short_str(f.get("kv_cache_spec_kind")),
            sliding_window=_opt_int(f.get("kv_cache_spec_sliding_window")),
        )
    if tag == _REMOVED:
        f, extra = _fields(raw, _REMOVED_FIELDS, tally, _REMOVED_MAP_FIELDS)
        return RemovedEvent(
            hashes=_hashes(f.get("block_hashes")), medium=_opt_str(f.get("medium")),
            extra=extra, group=_group(f.get("group_idx")),
        )  # fmt: skip
    if tag == _CLEARED:
        f, extra = _fields(raw, ("medium",), tally)
        return ClearedEvent(medium=_opt_str(f.get("medium")), extra=extra)
    return None
