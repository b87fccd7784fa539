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
output length the tokens later appended to that request.

The whole file is validated before anything is returned: a bad row raises
:class:`TraceError` naming its line and field, and nothing is half read.
What a trace may imply is bounded by :class:`TraceLimits` (rows, tokens per
request and in all, tokens per id, arrival times): a trace past one is
refused naming the limit, before any replay builds a pool for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from blockpool.errors import BlockPoolError

TOKENS_PER_ID = 512
MAX_LINE_BYTES = 16 * 1024 * 1024
RECORDING_FORMAT = "blockpool-recording"
MAX_ID = 2**63 - 1  # hash ids and token ids of a trace, at most


@dataclass(frozen=True)
class TraceLimits:
    """What one trace may imply.  The defaults bound an offline replay
    (``blockpool trace``); the service passes tighter ones."""

    max_requests: int = 10_000_000
    max_tokens_per_request: int = 1 << 24  # input + output of one request
    max_total_tokens: int = 1 << 31  # input + output of all requests
    max_tokens_per_id: int = 1 << 20
    max_timestamp_ms: float = 1e12  # arrival after the start (~31 years), at most


DEFAULT_LIMITS = TraceLimits()


class TraceError(BlockPoolError, ValueError):
    """A trace that cannot be read; ``line`` is the 1-based line at fault (0: the file),
    ``field`` the field at fault (or None), ``limit`` the name of the
    :class:`TraceLimits` bound it is past (or None)."""

    def __init__(
        self, message: str, line: int = 0, field: str | None = None, limit: str | None = None
    ) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.field = field
        self.limit = limit
        self.reason = message


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace.  Either ``hash_ids`` (Mooncake) or
    ``token_ids`` (a recording) describe the prompt."""

    index: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] | None = None
    lora_name: str | None = None
    cache_salt: str | None = None
    line: int = 0
    priority: int = 0  # the scheduler's priority policy: lower runs first


@dataclass
class Trace:
    """A validated trace: its requests in arrival order."""

    requests: list[TraceRequest]
    tokens_per_id: int = TOKENS_PER_ID
    source: str = "mooncake"
    _output_base: int = field(default=-1, repr=False)
    _output_offsets: list[int] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    def prompt_token_ids(
        self, req: TraceRequest, start: int = 0, stop: int | None = None
    ) -> list[int]:
        """The prompt's token ids (``[start:stop]`` of them; only those are built)."""
        end = req.input_length if stop is None else min(stop, req.input_length)
        if req.token_ids is not None:
            return list(req.token_ids[start:end])
        if start >= end:
            return []
        tpi = self.tokens_per_id
        ids = req.hash_ids
        first, last = start // tpi, (end - 1) // tpi
        spans = (
            range(
                ids[k] * tpi + (start - k * tpi if k == first else 0),
                ids[k] * tpi + (end - k * tpi if k == last else tpi),
            )
            for k in range(first, last + 1)
        )
        return list(chain.from_iterable(spans))

    def output_token_ids(
        self, req: TraceRequest, start: int = 0, stop: int | None = None
    ) -> list[int]:
        """``output_length`` token ids no other request and no prompt uses
        (``[start:stop]`` of them)."""
        if self._output_base < 0:
            self._plan_outputs()
        first = self._output_base + self._output_offsets[req.index]
        end = req.output_length if stop is None else min(stop, req.output_length)
        return list(range(first + start, first + end)) if start < end else []

    def max_token_id(self) -> int:
        """The largest token id any prompt or output of the trace uses."""
        if self._output_base < 0:
            self._plan_outputs()
        outputs = sum(r.output_length for r in self.requests)
        return self._output_base + outputs - 1 if outputs else self._output_base - 1

    def _plan_outputs(self) -> None:
        top = 0
        for r in self.requests:
            if r.token_ids is not None:
                top = max(top, max(r.token_ids, default=0) + 1)
            elif r.hash_ids:
                top = max(top, (max(r.hash_ids) + 1) * self.tokens_per_id)
        offsets, acc = [], 0
        for r in self.requests:
            offsets.append(acc)
            acc += r.output_length
        self._output_base, self._output_offsets = top, offsets


# ----------------------------------------------------------------- Mooncake


def _int_field(row: dict[str, Any], name: str, line: int, minimum: int, maximum: int) -> int:
    if name not in row:
        raise TraceError(f"missing field {name!r}", line, name)
    v = row[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{name} must be an integer, got {_show(v)}", line, name)
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


def _show(v: Any) -> str:
    """A value for an error message, cut short (a huge list or number stays readable)."""
    text = (
        repr(v)
        if not isinstance(v, int) or abs(v) < 10**30
        else f"an integer of {len(str(abs(v)))} digits"
    )
    return text if len(text) <= 80 else text[:77] + "..."


def _timestamp(v: Any, line: int, name: str, limits: TraceLimits) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TraceError(f"{name} must be a finite number >= 0, got {_show(v)}", line, name)
    try:
        ts = float(v)
    except OverflowError:  # an int past float's range
        ts = math.inf
    if not math.isfinite(ts) or ts < 0:
        raise TraceError(f"{name} must be a finite number >= 0, got {_show(v)}", line, name)
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
                f"hash_ids must hold integers >= 0 and <= {MAX_ID}, got {_show(h)}",
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


def _json_lines(lines: Iterable[str | bytes]) -> Iterator[tuple[int, Any]]:
    for n, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"line longer than {MAX_LINE_BYTES} bytes", n)
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        yield n, _loads(text, n)


def _loads(text: str, line: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not JSON: {exc.msg} (column {exc.colno})", line) from None
    except RecursionError:
        raise TraceError("not JSON this service reads: nested too deeply", line) from None
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        raise TraceError(f"not JSON this service reads: {str(exc).split(';')[0]}", line) from None


class _Totals:
    """The running count of requests and tokens against the limits."""

    def __init__(self, limits: TraceLimits) -> None:
        self.limits = limits
        self.requests = 0
        self.tokens = 0

    def add_request(self, line: int) -> None:
        self.requests += 1
        if self.requests > self.limits.max_requests:
            raise TraceError(
                f"more than {self.limits.max_requests} requests (max_requests)",
                line,
                None,
                "max_requests",
            )

    def add_tokens(self, n: int, line: int, name: str) -> None:
        self.tokens += n
        if self.tokens > self.limits.max_total_tokens:
            raise TraceError(
                f"the trace's requests hold more than {self.limits.max_total_tokens} tokens in "
                "all (max_total_tokens)",
                line,
                name,
                "max_total_tokens",
            )


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
    reqs: list[TraceRequest] = []
    totals = _Totals(limits)
    prev_ts = 0.0
    for n, row in _json_lines(lines):
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
    if not reqs:
        raise TraceError("the trace holds no request")
    return Trace(reqs, tokens_per_id, "mooncake")


# ---------------------------------------------------------------- recordings


def _request_id(op: dict[str, Any], line: int, required: bool) -> str | None:
    rid = op.get("request_id")
    if rid is None and not required:
        return None
    if not isinstance(rid, str):
        raise TraceError(f"op.request_id must be a string, got {_show(rid)}", line, "op.request_id")
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


def parse_recording(lines: Iterable[str | bytes], limits: TraceLimits = DEFAULT_LIMITS) -> Trace:
    """The admitted requests of a ``blockpool-recording`` export."""
    reqs: list[dict[str, Any]] = []
    running: dict[str, int] = {}
    totals = _Totals(limits)
    cap = limits.max_tokens_per_request
    t0: float | None = None
    header = False
    for n, row in _json_lines(lines):
        if not isinstance(row, dict):
            raise TraceError("a row must be a JSON object", n)
        kind = row.get("type")
        if not header:
            if kind != "header" or row.get("format") != RECORDING_FORMAT:
                raise TraceError(f"not a {RECORDING_FORMAT} (no header line first)", n)
            header = True
            continue
        if kind != "op" or not row.get("ok"):
            continue
        op = row.get("op")
        ts = row.get("ts")
        if not isinstance(op, dict):
            raise TraceError("an op row needs an 'op' object", n, "op")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise TraceError(f"ts must be a finite number, got {_show(ts)}", n, "ts")
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
                    f"result.request_id must be a string, got {_show(rid)}", n, "result.request_id"
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


# --------------------------------------------------------------------- files


def _first_row(text: str) -> Any:
    for raw in text.splitlines():
        if raw.strip():
            try:
                return _loads(raw, 1)
            except TraceError:
                return None  # the parser names it
    return None


def parse_trace(
    text: str | bytes, tokens_per_id: int = TOKENS_PER_ID, limits: TraceLimits = DEFAULT_LIMITS
) -> Trace:
    """A Mooncake trace or a recording, told apart by the first line."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"not UTF-8 text (byte {exc.start})") from None
    first = _first_row(text)
    lines = text.splitlines()
    if isinstance(first, dict) and first.get("format") == RECORDING_FORMAT:
        return parse_recording(lines, limits)
    return parse_mooncake(lines, tokens_per_id, limits)


def read_trace(
    path: str | Path, tokens_per_id: int = TOKENS_PER_ID, limits: TraceLimits = DEFAULT_LIMITS
) -> Trace:
    """Read and validate a trace file (TraceError when it cannot be read)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_trace(data, tokens_per_id, limits)
