"""A mirror's traffic read as a trace: a ``blockpool-mirror-trace`` file
(``GET /api/mirror/trace``), or the request rows of a mirror's recording
(``GET /api/history/export``).  Both hold Mooncake rows whose hash ids
stand for the engine's block hashes, one id a block: ``tokens_per_id`` is
the engine's block size, taken from the file (the header's
``tokens_per_id``; a recording's ``settings.block_size``), whatever
``--tokens-per-id`` says.  Format: ``blockpool/common/traffic_format.py``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from blockpool.common.traffic_format import REQUEST_ROW, TRAFFIC_FORMAT
from blockpool.trace.workload.limits import (
    DEFAULT_LIMITS,
    TraceError,
    TraceLimits,
    json_lines,
)
from blockpool.trace.workload.mooncake import mooncake_requests
from blockpool.trace.workload.requests import Trace


def _tokens_per_id(v: Any, limits: TraceLimits, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limits.max_tokens_per_id:
        raise TraceError(
            f"{where} must be an integer 1..{limits.max_tokens_per_id}, got {v!r:.40}", 1, where
        )
    return v


def _rows(
    rows: Iterable[tuple[int, Any]], tokens_per_id: int, limits: TraceLimits, source: str
) -> Trace:
    reqs = mooncake_requests(rows, tokens_per_id, limits)
    if not reqs:
        raise TraceError(f"the {source} holds no request (no engine request finished in it)")
    return Trace(reqs, tokens_per_id, source)


def parse_traffic(lines: Iterable[str | bytes], limits: TraceLimits = DEFAULT_LIMITS) -> Trace:
    """A ``blockpool-mirror-trace`` file: its header, then Mooncake rows."""
    it = json_lines(lines)
    first = next(it, None)
    if first is None or not isinstance(first[1], dict) or first[1].get("format") != TRAFFIC_FORMAT:
        raise TraceError(f"not a {TRAFFIC_FORMAT} (no header line first)", first[0] if first else 0)
    tpi = _tokens_per_id(first[1].get("tokens_per_id"), limits, "tokens_per_id")
    return _rows(it, tpi, limits, "mirror traffic")


def recording_tokens_per_id(header: dict[str, Any], limits: TraceLimits) -> int:
    """A mirror's recording: the engine's hash block size (its block size)."""
    engine = header.get("engine")
    if isinstance(engine, dict) and engine.get("tokens_per_id") is not None:
        return _tokens_per_id(engine["tokens_per_id"], limits, "engine.tokens_per_id")
    settings = header.get("settings")
    size = settings.get("block_size") if isinstance(settings, dict) else None
    return _tokens_per_id(size, limits, "settings.block_size")


def parse_recording_requests(
    header: dict[str, Any], rows: Iterable[tuple[int, Any]], limits: TraceLimits = DEFAULT_LIMITS
) -> Trace:
    """A mirror's recording: its ``request`` rows (other rows skipped)."""
    tpi = recording_tokens_per_id(header, limits)
    picked = (
        (n, {k: v for k, v in row.items() if k != "type"})
        for n, row in rows
        if isinstance(row, dict) and row.get("type") == REQUEST_ROW
    )
    return _rows(picked, tpi, limits, "mirror recording")
