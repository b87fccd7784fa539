"""The service's recordings (``GET /api/history/export``) read as a trace:
each successful ``admit`` is a request (its token ids the prompt, the
operation's time its arrival), the tokens later appended to it its outputs.
A mirror's recording (its header names the engine: its pool only ever saw
block operations) is read for the engine's requests it carries
(``traffic.py``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from blockpool.trace.workload import limits as trace_limits
from blockpool.trace.workload.limits import MAX_ID, TraceError, show_value
from blockpool.trace.workload.requests import TOKENS_PER_ID, Trace, TraceRequest
from blockpool.trace.workload.traffic import parse_recording_requests

RECORDING_FORMAT = "blockpool-recording"


def _request_id(op: dict[str, Any], line: int, required: bool) -> str | None:
    rid = op.get("request_id")
    if rid is None and not required:
        return None
    if not isinstance(rid, str):
        raise TraceError(
            f"op.request_id must be a string, got {show_value(rid)}", line, "op.request_id"
        )
    return rid


def _token_list(v: Any, line: int, opname: str, nonempty: bool) -> list[int]:
    if (
        not isinstance(v, list)
        or (nonempty and not v)
        or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_ID for t in v)
    ):
        what = "a non-empty list" if nonempty else "a list"
        raise TraceError(
            f"{opname} token_ids must be {what} of ints >= 0 and <= {MAX_ID}", line, "op.token_ids"
        )
    return v


def parse_recording(
    lines: Iterable[str | bytes], limits: trace_limits.TraceLimits = trace_limits.DEFAULT_LIMITS
) -> Trace:
    """The admitted requests of a ``blockpool-recording`` export."""
    reqs: list[dict[str, Any]] = []
    running: dict[str, int] = {}
    totals = trace_limits.Totals(limits)
    cap = limits.max_tokens_per_request
    t0: float | None = None
    header = False
    rows = trace_limits.json_lines(lines)
    for n, row in rows:
        if not isinstance(row, dict):
            raise TraceError("a row must be a JSON object", n)
        kind = row.get("type")
        if not header:
            if kind != "header" or row.get("format") != RECORDING_FORMAT:
                raise TraceError(f"not a {RECORDING_FORMAT} (no header line first)", n)
            if isinstance(row.get("engine"), dict):  # a mirror's: the engine's requests
                return parse_recording_requests(row, rows, limits)
            header = True
            continue
        if kind != "op" or not row.get("ok"):
            continue
        op = row.get("op")
        ts = row.get("ts")
        if not isinstance(op, dict):
            raise TraceError("an op row needs an 'op' object", n, "op")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise TraceError(f"ts must be a finite number, got {show_value(ts)}", n, "ts")
        name = op.get("op")
        if name == "admit":
            toks = _token_list(op.get("token_ids"), n, "admit", True)
            if len(toks) > cap:
                raise TraceError(
                    f"op.token_ids holds {len(toks)} tokens, over the limit of {cap} a request "
                    "(max_tokens_per_request)",
                    n,
                    "op.token_ids",
                    "max_tokens_per_request",
                )
            result = row.get("result")
            rid = result.get("request_id") if isinstance(result, dict) else None
            if rid is not None and not isinstance(rid, str):
                raise TraceError(
                    f"result.request_id must be a string, got {show_value(rid)}",
                    n,
                    "result.request_id",
                )
            rid = _request_id(op, n, False) if rid is None else rid
            t0 = float(ts) if t0 is None else t0
            at = (float(ts) - t0) * 1000.0
            if reqs and at < reqs[-1]["timestamp_ms"]:
                raise TraceError("operations must be in time order", n, "ts")
            if at > limits.max_timestamp_ms:
                raise TraceError(
                    f"ts is {at:g} ms after the first admission, past the limit of "
                    f"{limits.max_timestamp_ms:g} ms (max_timestamp_ms)",
                    n,
                    "ts",
                    "max_timestamp_ms",
                )
            for k in ("lora_name", "cache_salt"):
                if op.get(k) is not None and not isinstance(op.get(k), str):
                    raise TraceError(f"{k} must be a string", n, f"op.{k}")
            totals.add_request(n)
            totals.add_tokens(len(toks), n, "op.token_ids")
            if rid is not None:
                running[rid] = len(reqs)
            reqs.append(
                {
                    "timestamp_ms": at,
                    "token_ids": tuple(toks),
                    "lora_name": op.get("lora_name"),
                    "cache_salt": op.get("cache_salt"),
                    "output_length": 0,
                    "line": n,
                }
            )
        elif name == "append":
            rid = _request_id(op, n, True)
            toks = _token_list(op.get("token_ids"), n, "append", False)
            i = running.get(rid) if rid is not None else None
            if i is not None:
                r = reqs[i]
                r["output_length"] += len(toks)
                if len(r["token_ids"]) + r["output_length"] > cap:
                    raise TraceError(
                        f"request {rid!r} (admitted on line {r['line']}) grows past the limit "
                        f"of {cap} tokens a request (max_tokens_per_request)",
                        n,
                        "op.token_ids",
                        "max_tokens_per_request",
                    )
                totals.add_tokens(len(toks), n, "op.token_ids")
        elif name == "finish":
            rid = _request_id(op, n, True)
            if rid is not None:
                running.pop(rid, None)
    if not header:
        raise TraceError(f"empty file: not a {RECORDING_FORMAT}")
    if not reqs:
        raise TraceError("the recording holds no admitted request")
    out = [
        TraceRequest(
            i,
            r["timestamp_ms"],
            len(r["token_ids"]),
            r["output_length"],
            (),
            r["token_ids"],
            r["lora_name"],
            r["cache_salt"],
            r["line"],
        )
        for i, r in enumerate(reqs)
    ]
    return Trace(out, TOKENS_PER_ID, "recording")
