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

The decoded forms are in ``observed.py``, one event's reading in
``event_reader.py``, the hash forms in ``hashes.py``.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from blockpool.kvevents.event_reader import BadNumber, read_event
from blockpool.kvevents.extra import Tally
from blockpool.kvevents.observed import Encoding, ObservedBatch, ObservedEvent

MAX_BATCH_BYTES = 32 * 1024 * 1024  # the default refusal size of one payload


class DecodeError(ValueError):
    """The payload is not a KV-event batch at all; ``kind`` names why
    (``too_large``, ``too_deep``, ``not_msgpack``, ``not_a_batch``)."""

    def __init__(self, message: str, kind: str = "not_a_batch") -> None:
        super().__init__(message)
        self.kind = kind


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
            ev = read_event(item, tally)
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
