"""The fields of an event beyond the ones the observer applies: vLLM's newer
fields (known, kept for the views) and fields no vLLM release we know sends
(kept too, and counted -- a sign of a publisher newer than this observer).

Every kept value is made JSON-safe and bounded here: at most
``EXTRA_MAX_DEPTH`` levels and ``EXTRA_MAX_ITEMS`` items per container,
strings and bytes cut to ``EXTRA_MAX_TEXT``, non-finite floats written as
text; each cut is counted (poison kind ``extra_cut``).
"""

from __future__ import annotations

import math
from typing import Any

EXTRA_MAX_DEPTH = 8
EXTRA_MAX_ITEMS = 256
EXTRA_MAX_TEXT = 4096
MAX_UNKNOWN_NAMES = 64  # distinct unknown field names remembered per stream

# vLLM >= 0.24's map-tagged events: fields we keep for the views but do not
# apply (group_idx and the cache spec are applied: decode.py reads them).
KNOWN_KEPT = frozenset({"extra_keys", "locality", "ownership", "session_id", "lookahead_token_ids"})
GROUP_FIELDS = ("group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")


class Tally:
    """What decoding one batch trimmed, and the unknown fields it kept."""

    __slots__ = ("cut", "unknown_names")

    def __init__(self) -> None:
        self.cut = 0
        self.unknown_names: dict[str, int] = {}  # name -> times; "<other>" past the limit

    def unknown(self, name: str, n: int = 1) -> None:
        names = self.unknown_names
        if name not in names and len(names) >= MAX_UNKNOWN_NAMES:
            name = "<other>"
        names[name] = names.get(name, 0) + n


def safe(value: Any, tally: Tally, depth: int = 0) -> Any:
    """``value``, JSON-safe and bounded (cuts counted in ``tally.cut``)."""
    if isinstance(value, float) and not math.isfinite(value):
        tally.cut += 1
        return repr(value)
    if isinstance(value, list | tuple | dict):
        if depth >= EXTRA_MAX_DEPTH:
            tally.cut += 1
            return "<nested too deep>"
        if len(value) > EXTRA_MAX_ITEMS:
            tally.cut += 1
        if isinstance(value, dict):
            items = list(value.items())[:EXTRA_MAX_ITEMS]
            return {field_name(k): safe(v, tally, depth + 1) for k, v in items}
        return [safe(v, tally, depth + 1) for v in value[:EXTRA_MAX_ITEMS]]
    if isinstance(value, bytes | str) and len(value) > EXTRA_MAX_TEXT:
        tally.cut += 1
        return value[:EXTRA_MAX_TEXT]
    return value


def field_name(k: Any) -> str:
    if isinstance(k, bytes):
        return k[:200].decode("utf-8", "replace")
    return k[:200] if isinstance(k, str) else repr(k)[:200]
