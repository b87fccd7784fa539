"""A recording as JSON lines: the header (the pool's settings, its free
order included, and on a mirror the engine's facts), every keyframe and
operation in order (each operation with its events), a mirror's engine
requests (``request`` rows: ``blockpool/common/traffic_format.py``; replay
skips them, ``blockpool trace`` reads them), then a ``final`` keyframe of
the state at export time.  ``replay.replay_file`` replays such a file and
checks it.  Events are written losslessly (hashes stay ints, or hex for raw
digests).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from blockpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from blockpool.analysis.segment import Entry, EventsView, Segment, unpack
from blockpool.runtime.ops import public_form
from blockpool.runtime.state import RuntimeKeyframe, keyframe_json

if TYPE_CHECKING:
    from blockpool.runtime.runtime import PoolRuntime

FORMAT = "blockpool-recording"
VERSION = 1
# Settings that shape the pool (the header keeps them; never the token).
POOL_SETTINGS = (
    "num_blocks",
    "block_size",
    "num_groups",
    "hash_fn",
    "hash_seed",
    "enable_caching",
    "enable_events",
    "free_order",
    "metrics_sample_rate",
    "metrics_seed",
    "max_ids_per_call",
    "max_tokens_per_request",
    "max_requests",
)


def header_json(
    engine: PoolRuntime,
    first_seq: int,
    last_seq: int,
    engine_facts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The export's first line: the format, the pool's settings and, on a
    mirror, what the engine is (``engine_facts``: vLLM version, blocks,
    block size, hash function, free order...; None elsewhere)."""
    s = engine.config
    return {
        "type": "header",
        "format": FORMAT,
        "version": VERSION,
        "created": time.time(),
        "settings": {
            **{k: getattr(s, k) for k in POOL_SETTINGS},
            "num_blocks": engine.pool.num_gpu_blocks,
        },
        "first_seq": first_seq,
        "last_seq": last_seq,
        "engine": engine_facts,
    }


def entry_json(entry: Entry, view: EventsView) -> dict[str, Any]:
    seq, ts, op, ok, payload = unpack(entry)
    op, payload = public_form(op, ok, payload)  # an engine's hashes hexed here, once
    events = view.of(entry)
    return {
        "type": "op",
        "seq": seq,
        "ts": ts,
        "op": msgspec.to_builtins(op),
        "ok": ok,
        "result" if ok else "error": payload,
        "events": None if events is None else [event_to_json(ev) for ev in events],
    }


def export_lines(
    header: dict[str, Any],
    segments: list[Segment],
    final: RuntimeKeyframe,
    view: EventsView,
    requests: Iterable[str] = (),
) -> Iterator[str]:
    """JSON lines (each ends with a newline); ``requests``: a mirror's
    request rows, already lines, written before the final keyframe."""
    dumps = json.dumps
    yield dumps(header) + "\n"
    for seg in segments:
        yield dumps({"type": "keyframe", **keyframe_json(seg.keyframe)}) + "\n"
        for entry in seg.entries():
            yield dumps(entry_json(entry, view)) + "\n"
    yield from requests
    yield dumps({"type": "final", **keyframe_json(final)}) + "\n"


# ----------------------------------------------------------------- events


def _hash_json(h: int | bytes) -> int | str:
    return h if isinstance(h, int) else h.hex()


def _hash_from(v: int | str) -> int | bytes:
    return v if isinstance(v, int) else bytes.fromhex(v)


def event_to_json(ev: KVCacheEvent) -> dict[str, Any]:
    """Lossless (hashes stay ints, or hex for raw digests)."""
    if isinstance(ev, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": [_hash_json(h) for h in ev.block_hashes],
            "parent_block_hash": None
            if ev.parent_block_hash is None
            else _hash_json(ev.parent_block_hash),
            "token_ids": ev.token_ids,
            "block_size": ev.block_size,
            "lora_id": ev.lora_id,
            "medium": ev.medium,
            "lora_name": ev.lora_name,
        }
    if isinstance(ev, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": [_hash_json(h) for h in ev.block_hashes],
            "medium": ev.medium,
        }
    return {"type": type(ev).__name__}


def event_from_json(d: dict[str, Any]) -> KVCacheEvent:
    kind = d["type"]
    if kind == "BlockStored":
        parent = d["parent_block_hash"]
        return BlockStored(
            [_hash_from(h) for h in d["block_hashes"]],
            None if parent is None else _hash_from(parent),
            list(d["token_ids"]),
            d["block_size"],
            d["lora_id"],
            d["medium"],
            d["lora_name"],
        )
    if kind == "BlockRemoved":
        return BlockRemoved([_hash_from(h) for h in d["block_hashes"]], d["medium"])
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown event type {kind!r}")
