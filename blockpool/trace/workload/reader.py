"""Reading traces: Mooncake JSON lines and the service's own recordings.

A Mooncake trace is one JSON object a line, in arrival order::

    {"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, ...]}

``timestamp`` in milliseconds, one hash id per ``tokens_per_id`` (512) prompt
tokens, prefix-chained.  Tokens: hash id ``h`` at offset ``j`` becomes the
token ``h * tokens_per_id + j`` (injective in ``(h, j)``); the last id holds
``input_length - tokens_per_id * (n - 1)`` tokens, which must be 1 ..
``tokens_per_id``.  Output tokens are unique per request and disjoint from
every prompt token (they start above the largest prompt token).

A recording (``GET /api/history/export``: a ``blockpool-recording`` header,
keyframes, operations) is read for its successful ``admit`` operations: the
prompt is the admitted token ids, the arrival the operation's time, the
output length the tokens later appended to that request.  A mirror's
recording (its header names the engine) is read for its ``request`` rows,
and a mirror's traffic (``GET /api/mirror/trace``, a
``blockpool-mirror-trace`` header) for its rows: the engine's requests
with one hash id a block (``traffic.py``).

A file may be gzip-compressed (``.gz`` or not: told by its first bytes);
decompressed it may hold at most ``MAX_FILE_BYTES``.

The whole file is validated before anything is returned: a bad row raises
:class:`TraceError` naming its line and field, and nothing is half read.
What a trace may imply is bounded by :class:`TraceLimits` (rows, tokens per
request and in all, tokens per id, arrival times): a trace past one is
refused naming the limit, before any replay builds a pool for it.

Here: a file or text told apart by its first line.  The trace itself is in
``requests.py``, the limits and the line reading in ``limits.py``, the two
formats in ``mooncake.py`` and ``recording.py``.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

from blockpool.common.bounded_read import read_bounded
from blockpool.common.traffic_format import TRAFFIC_FORMAT
from blockpool.trace.workload.limits import (
    DEFAULT_LIMITS,
    MAX_ID,
    MAX_LINE_BYTES,
    TraceError,
    TraceLimits,
    loads_line,
)
from blockpool.trace.workload.mooncake import parse_mooncake, parse_mooncake_row
from blockpool.trace.workload.recording import RECORDING_FORMAT, parse_recording
from blockpool.trace.workload.requests import TOKENS_PER_ID, Trace, TraceRequest
from blockpool.trace.workload.traffic import parse_traffic

MAX_FILE_BYTES = 8 << 30  # a trace file, decompressed, at most
GZIP_MAGIC = b"\x1f\x8b"

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_ID",
    "MAX_LINE_BYTES",
    "RECORDING_FORMAT",
    "TOKENS_PER_ID",
    "Trace",
    "TraceError",
    "TraceLimits",
    "TraceRequest",
    "parse_mooncake",
    "parse_mooncake_row",
    "parse_recording",
    "parse_trace",
    "read_trace",
]


def _first_row(text: str) -> Any:
    for raw in text.splitlines():
        if raw.strip():
            try:
                return loads_line(raw, 1)
            except TraceError:
                return None  # the parser names it
    return None


def gunzip(data: bytes, max_bytes: int) -> bytes:
    """A gzip file's content (TraceError when it is not gzip, or holds
    more than ``max_bytes``)."""
    d = zlib.decompressobj(31)
    out: list[bytes] = []
    size = 0
    try:
        chunk = d.decompress(data, max_bytes + 1)
        while True:
            size += len(chunk)
            out.append(chunk)
            if size > max_bytes:
                raise TraceError(f"gzip-compressed, and more than {max_bytes} bytes decompressed")
            if not d.unconsumed_tail:
                break
            chunk = d.decompress(d.unconsumed_tail, max_bytes + 1 - size)
    except zlib.error as exc:
        raise TraceError(f"gzip-compressed, but cannot be decompressed: {exc}") from None
    if not d.eof:
        raise TraceError("gzip-compressed, but cut off before its end")
    return b"".join(out)


def parse_trace(
    text: str | bytes,
    tokens_per_id: int = TOKENS_PER_ID,
    limits: TraceLimits = DEFAULT_LIMITS,
    gzip_max_bytes: int | None = None,
) -> Trace:
    """A Mooncake trace, a recording or a mirror's traffic, told apart by
    the first line; gzip-compressed bytes only with ``gzip_max_bytes``
    (what they may hold decompressed)."""
    if isinstance(text, bytes) and text[:2] == GZIP_MAGIC:
        if gzip_max_bytes is None:
            raise TraceError("gzip-compressed: decompress it first")
        text = gunzip(text, gzip_max_bytes)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"not UTF-8 text (byte {exc.start})") from None
    first = _first_row(text)
    lines = text.splitlines()
    if isinstance(first, dict) and first.get("format") == RECORDING_FORMAT:
        return parse_recording(lines, limits)
    if isinstance(first, dict) and first.get("format") == TRAFFIC_FORMAT:
        return parse_traffic(lines, limits)
    return parse_mooncake(lines, tokens_per_id, limits)


def read_trace(
    path: str | Path, tokens_per_id: int = TOKENS_PER_ID, limits: TraceLimits = DEFAULT_LIMITS
) -> Trace:
    """Read and validate a trace file, gzip-compressed or not (TraceError
    when it cannot be read)."""
    try:
        data = read_bounded(path, MAX_FILE_BYTES)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    return parse_trace(data, tokens_per_id, limits, MAX_FILE_BYTES)
