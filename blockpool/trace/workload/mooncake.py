"""Mooncake JSON lines: one request a row, validated whole."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from blockpool.trace.workload.limits import (
    DEFAULT_LIMITS,
    MAX_ID,
    Totals,
    TraceError,
    TraceLimits,
    json_lines,
    show_value,
)
from blockpool.trace.workload.requests import TOKENS_PER_ID, Trace, TraceRequest


def _int_field(row: dict[str, Any], name: str, line: int, minimum: int, maximum: int) -> int:
    if name not in row:
        raise TraceError(f"missing field {name!r}", line, name)
    v = row[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{name} must be an integer, got {show_value(v)}", line, name)
    if v < minimum:
        raise TraceError(f"{name} must be >= {minimum}, got {v}", line, name)
    if v > maximum:
        raise TraceError(
            f"{name} {v} is over the limit of {maximum} tokens a request (max_tokens_per_request)",
            line,
            name,
            "max_tokens_per_request",
        )
    return v


def _timestamp(v: Any, line: int, name: str, limits: TraceLimits) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TraceError(f"{name} must be a finite number >= 0, got {show_value(v)}", line, name)
    try:
        ts = float(v)
    except OverflowError:  # an int past float's range
        ts = math.inf
    if not math.isfinite(ts) or ts < 0:
        raise TraceError(f"{name} must be a finite number >= 0, got {show_value(v)}", line, name)
    if ts > limits.max_timestamp_ms:
        raise TraceError(
            f"{name} {ts:g} ms is past the limit of {limits.max_timestamp_ms:g} ms after the "
            "start (max_timestamp_ms)",
            line,
            name,
            "max_timestamp_ms",
        )
    return ts


def parse_mooncake_row(
    row: Any,
    line: int,
    index: int,
    tokens_per_id: int = TOKENS_PER_ID,
    limits: TraceLimits = DEFAULT_LIMITS,
) -> TraceRequest:
    """One validated Mooncake row (TraceError naming ``line`` and the field otherwise)."""
    if not isinstance(row, dict):
        raise TraceError("a row must be a JSON object", line)
    ts = _timestamp(row.get("timestamp"), line, "timestamp", limits)
    cap = limits.max_tokens_per_request
    input_length = _int_field(row, "input_length", line, 1, cap)
    output_length = _int_field(row, "output_length", line, 0, cap)
    if input_length + output_length > cap:
        raise TraceError(
            f"input_length + output_length = {input_length + output_length} is over the limit "
            f"of {cap} tokens a request (max_tokens_per_request)",
            line,
            "output_length",
            "max_tokens_per_request",
        )
    ids = row.get("hash_ids")
    if not isinstance(ids, list) or not ids:
        raise TraceError("hash_ids must be a non-empty list", line, "hash_ids")
    for h in ids:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_ID:
            raise TraceError(
                f"hash_ids must hold integers >= 0 and <= {MAX_ID}, got {show_value(h)}",
                line,
                "hash_ids",
            )
    last = input_length - tokens_per_id * (len(ids) - 1)
    if not 1 <= last <= tokens_per_id:
        raise TraceError(
            f"{len(ids)} hash ids of {tokens_per_id} tokens cannot hold input_length "
            f"{input_length} (the last id would hold {last} tokens; 1..{tokens_per_id} allowed)",
            line,
            "hash_ids",
        )
    prio = row.get("priority", 0)
    if isinstance(prio, bool) or not isinstance(prio, int) or abs(prio) > 2**31:
        raise TraceError(
            f"priority must be an integer within ±2^31, got {prio!r}", line, "priority"
        )
    return TraceRequest(
        index, float(ts), input_length, output_length, tuple(ids), line=line, priority=prio
    )


def mooncake_requests(
    rows: Iterable[tuple[int, Any]], tokens_per_id: int, limits: TraceLimits
) -> list[TraceRequest]:
    """Mooncake rows (line number, parsed row), each validated, in arrival
    order, within the limits' totals."""
    reqs: list[TraceRequest] = []
    totals = Totals(limits)
    prev_ts = 0.0
    for n, row in rows:
        totals.add_request(n)
        req = parse_mooncake_row(row, n, len(reqs), tokens_per_id, limits)
        if req.timestamp_ms < prev_ts:
            raise TraceError(
                f"timestamp {req.timestamp_ms:g} is before the previous row's {prev_ts:g} "
                "(rows must be in arrival order)",
                n,
                "timestamp",
            )
        totals.add_tokens(req.input_length + req.output_length, n, "input_length")
        prev_ts = req.timestamp_ms
        reqs.append(req)
    return reqs


def parse_mooncake(
    lines: Iterable[str | bytes],
    tokens_per_id: int = TOKENS_PER_ID,
    limits: TraceLimits = DEFAULT_LIMITS,
) -> Trace:
    """A validated Mooncake trace from its lines."""
    if isinstance(tokens_per_id, bool) or not isinstance(tokens_per_id, int) or tokens_per_id < 1:
        raise TraceError(f"tokens per id must be a positive integer, got {tokens_per_id!r}")
    if tokens_per_id > limits.max_tokens_per_id:
        raise TraceError(
            f"tokens per id {tokens_per_id} is over the limit of {limits.max_tokens_per_id} "
            "(max_tokens_per_id)",
            0,
            "tokens_per_id",
            "max_tokens_per_id",
        )
    reqs = mooncake_requests(json_lines(lines), tokens_per_id, limits)
    if not reqs:
        raise TraceError("the trace holds no request")
    return Trace(reqs, tokens_per_id, "mooncake")
