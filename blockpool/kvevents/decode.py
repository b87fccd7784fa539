"""A tolerant decoder for KV-event batches from any vLLM-like publisher.

Publishers disagree on the msgpack shape of the same three events:

* vLLM 0.16 (and blockpool, and SGLang's copy of vLLM's classes) send
  positional arrays: a batch is ``[ts, [event, ...], dp_rank]`` and an event
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name]``; older releases stop earlier (no medium, no
  lora_name, no rank), newer ones may append fields.
* Others send maps tagged by a ``"type"`` field:
  ``{"ts": .., "events": [{"type": "BlockStored", "block_hashes": [..],
  ...}], "data_parallel_rank": 0}``, possibly with fields we do not know
  (``extra_keys``, ...).

Hashes come as 64-bit ints (vLLM's default, sometimes signed) or as bytes
(the full digest).  Ints are normalised to unsigned 64-bit; bytes stay bytes.
The payload is decoded untyped (``msgspec.msgpack.decode``) and read field by
field, so an unexpected shape costs one event (counted), never the stream.

Poison is bounded before and while decoding: a payload over ``max_bytes`` is
refused unread; msgspec stops at the interpreter's recursion limit (about
1,000 levels -- refused as ``too_deep``, never a ``RecursionError``); numbers
are checked (a token id must be a finite integer, the batch's ``ts`` a finite
number); fields kept as ``extra`` are made JSON-safe and bounded (``extra.py``).

vLLM >= 0.24 tags events with their KV-cache group (``group_idx``; hybrid
models: full attention + sliding window) and, on BlockStored, the group's
cache spec: read into ``group`` / ``spec_kind`` / ``sliding_window``.  Its
other new fields are kept in ``extra``; fields no release we know sends are
kept too and counted (``ObservedBatch.unknown_fields``).  What was refused or cut is counted
per kind in ``DecodeError.kind`` / ``ObservedBatch.issues``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

from blockpool.kvevents.extra import (
    EXTRA_MAX_ITEMS,
    GROUP_FIELDS,
    KNOWN_KEPT,
    Tally,
    field_name,
    safe,
)

MASK64 = (1 << 64) - 1
Hash = int | bytes
Encoding = Literal["positional", "map"]
MAX_BATCH_BYTES = 32 * 1024 * 1024  # the default refusal size of one payload
MAX_GROUP_IDX = 255  # KV-cache groups per model (vLLM has a handful)


class DecodeError(ValueError):
    """The payload is not a KV-event batch at all; ``kind`` names why
    (``too_large``, ``too_deep``, ``not_msgpack``, ``not_a_batch``)."""

    def __init__(self, message: str, kind: str = "not_a_batch") -> None:
        super().__init__(message)
        self.kind = kind


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


_STORED = "blockstored"
_REMOVED = "blockremoved"
_CLEARED = "allblockscleared"
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
)
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
_TAG_KEYS = ("type", "event_type", "kind", "tag")


def _tag(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise TypeError("event tag is not a string")
    return "".join(ch for ch in value.lower() if ch.isalnum())


def norm_hash(value: Any) -> Hash:
    """An event hash as the observer keys it: unsigned 64-bit int or bytes."""
    if isinstance(value, bool):
        raise TypeError("a hash cannot be a bool")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("0x")
        if text and all(c in "0123456789abcdef" for c in text):
            if len(text) <= 16:
                return int(text, 16)
            return bytes.fromhex(text if len(text) % 2 == 0 else "0" + text)
        raise ValueError(f"a text hash must be hex, not {value[:40]!r}")
    raise TypeError(f"a hash cannot be a {type(value).__name__}")


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


def _event(raw: Any, tally: Tally) -> ObservedEvent | None:
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


def decode_batch(
    payload: bytes,
    max_bytes: int = MAX_BATCH_BYTES,
    max_events: int | None = None,
    max_hashes: int | None = None,
    max_tokens: int | None = None,
) -> ObservedBatch:
    """Decode one message payload, whichever encoding it uses.  With
    ``max_events`` / ``max_hashes`` / ``max_tokens`` a batch with more
    events, or more block hashes or token ids in all, is refused
    (``too_many_events`` / ``too_many_hashes`` / ``too_many_tokens``) before
    more than that is read: the time one batch takes is bounded."""
    if len(payload) > max_bytes:
        raise DecodeError(f"{len(payload)} bytes, over the {max_bytes} limit", "too_large")
    try:
        raw = msgspec.msgpack.decode(payload)
    except RecursionError:
        raise DecodeError("nested too deep", "too_deep") from None
    except msgspec.DecodeError as exc:
        raise DecodeError(f"not msgpack: {exc}", "not_msgpack") from exc
    encoding: Encoding
    if isinstance(raw, list):
        if len(raw) < 2:
            raise DecodeError("a positional batch needs at least [ts, events]")
        ts_raw, events_raw = raw[0], raw[1]
        rank_raw = raw[2] if len(raw) > 2 else None
        encoding = "positional"
    elif isinstance(raw, dict):
        if "events" not in raw:
            raise DecodeError("a map batch needs an 'events' field")
        ts_raw = raw.get("ts")
        events_raw = raw["events"]
        rank_raw = raw.get("data_parallel_rank", raw.get("dp_rank"))
        encoding = "map"
    else:
        raise DecodeError(f"a batch is an array or a map, not {type(raw).__name__}")
    if not isinstance(events_raw, list):
        raise DecodeError("the batch's events are not a list")
    if max_events is not None and len(events_raw) > max_events:
        raise DecodeError(
            f"{len(events_raw)} events, over the limit of {max_events} per batch",
            "too_many_events",
        )
    hashes_left = max_hashes
    tokens_left = max_tokens
    if isinstance(ts_raw, bool) or not isinstance(ts_raw, int | float | None):
        raise DecodeError("the batch's ts is not a number")
    issues: dict[str, int] = {}
    ts = float(ts_raw) if ts_raw is not None else 0.0  # msgpack ints fit a float
    if not math.isfinite(ts):
        issues["non_finite_ts"] = 1
        ts = 0.0
    rank = rank_raw if isinstance(rank_raw, int) and not isinstance(rank_raw, bool) else None
    events: list[ObservedEvent] = []
    unknown = malformed = 0
    tally = Tally()
    for item in events_raw:
        if hashes_left is not None or tokens_left is not None:
            n_hashes, n_tokens = _raw_counts(item)  # before reading them
            if hashes_left is not None:
                hashes_left -= n_hashes
                if hashes_left < 0:
                    raise DecodeError(f"over {max_hashes} block hashes in one batch",
                                      "too_many_hashes")  # fmt: skip
            if tokens_left is not None:
                tokens_left -= n_tokens
                if tokens_left < 0:
                    raise DecodeError(f"over {max_tokens} token ids in one batch",
                                      "too_many_tokens")  # fmt: skip
        try:
            ev = _event(item, tally)
        except (BadNumber, OverflowError):
            malformed += 1
            issues["bad_number"] = issues.get("bad_number", 0) + 1
            continue
        except Exception:  # any other shape we cannot read: this event only
            malformed += 1
            issues["malformed_event"] = issues.get("malformed_event", 0) + 1
            continue
        if ev is None:
            unknown += 1
        else:
            events.append(ev)
    if encoding == "positional" and any(isinstance(e, dict) for e in events_raw):
        encoding = "map"
    return ObservedBatch(
        ts=ts,
        events=events,
        data_parallel_rank=rank,
        encoding=encoding,
        unknown=unknown,
        malformed=malformed,
        issues={**issues, "extra_cut": tally.cut} if tally.cut else (issues or None),
        unknown_fields=tally.unknown_names or None,
    )


def _raw_counts(item: Any) -> tuple[int, int]:
    """How many block hashes and token ids an undecoded event lists where
    BlockStored keeps them (0 for what is not a list there)."""
    if isinstance(item, list):
        hashes = item[1] if len(item) > 1 else None
        tokens = item[3] if len(item) > 3 else None
    elif isinstance(item, dict):
        hashes, tokens = item.get("block_hashes"), item.get("token_ids")
    else:
        return 0, 0
    return (
        len(hashes) if isinstance(hashes, list) else 0,
        len(tokens) if isinstance(tokens, list) else 0,
    )


def hash_hex(h: Hash) -> str:
    """A hash as the pages show it: 16 hex digits for the 64-bit int form."""
    return f"{h:016x}" if isinstance(h, int) else h.hex()


def parse_hash(text: str) -> Hash:
    """The inverse of ``hash_hex``: 16 or fewer hex digits are the int form;
    a decimal number prefixed ``d:`` too; longer hex is a digest."""
    t = text.strip().lower()
    if t.startswith("d:"):
        return int(t[2:]) & MASK64
    t = t.removeprefix("0x")
    if not t or any(c not in "0123456789abcdef" for c in t):
        raise ValueError(f"{text!r} is not a hash (hex digits, or d:<decimal>)")
    if len(t) <= 16:
        return int(t, 16)
    if len(t) % 2:
        raise ValueError(f"{text!r}: a digest needs an even number of hex digits")
    return bytes.fromhex(t)
