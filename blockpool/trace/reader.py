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
:class:`TraceError` naming its line, and nothing is half read.
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


class TraceError(BlockPoolError, ValueError):
    """A trace that cannot be read; ``line`` is the 1-based line at fault (0: the file)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
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

    def prompt_token_ids(self, req: TraceRequest) -> list[int]:
        """The prompt's token ids."""
        if req.token_ids is not None:
            return list(req.token_ids)
        tpi = self.tokens_per_id
        toks = list(chain.from_iterable(range(h * tpi, h * tpi + tpi) for h in req.hash_ids))
        del toks[req.input_length :]
        return toks

    def output_token_ids(self, req: TraceRequest) -> list[int]:
        """``output_length`` token ids no other request and no prompt uses."""
        if self._output_base < 0:
            self._plan_outputs()
        start = self._output_base + self._output_offsets[req.index]
        return list(range(start, start + req.output_length))

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


def _int_field(row: dict[str, Any], name: str, line: int, minimum: int) -> int:
    if name not in row:
        raise TraceError(f"missing field {name!r}", line)
    v = row[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{name} must be an integer, got {v!r}", line)
    if v < minimum:
        raise TraceError(f"{name} must be >= {minimum}, got {v}", line)
    return v


def parse_mooncake_row(
    row: Any, line: int, index: int, tokens_per_id: int = TOKENS_PER_ID
) -> TraceRequest:
    """One validated Mooncake row (TraceError naming ``line`` otherwise)."""
    if not isinstance(row, dict):
        raise TraceError("a row must be a JSON object", line)
    ts = row.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise TraceError(f"timestamp must be a finite number >= 0, got {ts!r}", line)
    input_length = _int_field(row, "input_length", line, 1)
    output_length = _int_field(row, "output_length", line, 0)
    ids = row.get("hash_ids")
    if not isinstance(ids, list) or not ids:
        raise TraceError("hash_ids must be a non-empty list", line)
    for h in ids:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise TraceError(f"hash_ids must hold integers >= 0, got {h!r}", line)
    last = input_length - tokens_per_id * (len(ids) - 1)
    if not 1 <= last <= tokens_per_id:
        raise TraceError(
            f"{len(ids)} hash ids of {tokens_per_id} tokens cannot hold input_length "
            f"{input_length} (the last id would hold {last} tokens; 1..{tokens_per_id} allowed)",
            line,
        )
    prio = row.get("priority", 0)
    if isinstance(prio, bool) or not isinstance(prio, int):
        raise TraceError(f"priority must be an integer, got {prio!r}", line)
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
        try:
            yield n, json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"not JSON: {exc.msg} (column {exc.colno})", n) from None


def parse_mooncake(lines: Iterable[str | bytes], tokens_per_id: int = TOKENS_PER_ID) -> Trace:
    """A validated Mooncake trace from its lines."""
    if isinstance(tokens_per_id, bool) or not isinstance(tokens_per_id, int) or tokens_per_id < 1:
        raise TraceError(f"tokens per id must be a positive integer, got {tokens_per_id!r}")
    reqs: list[TraceRequest] = []
    prev_ts = 0.0
    for n, row in _json_lines(lines):
        req = parse_mooncake_row(row, n, len(reqs), tokens_per_id)
        if req.timestamp_ms < prev_ts:
            raise TraceError(
                f"timestamp {req.timestamp_ms:g} is before the previous row's {prev_ts:g} "
                "(rows must be in arrival order)",
                n,
            )
        prev_ts = req.timestamp_ms
        reqs.append(req)
    if not reqs:
        raise TraceError("the trace holds no request")
    return Trace(reqs, tokens_per_id, "mooncake")


# ---------------------------------------------------------------- recordings


def parse_recording(lines: Iterable[str | bytes]) -> Trace:
    """The admitted requests of a ``blockpool-recording`` export."""
    reqs: list[dict[str, Any]] = []
    running: dict[str, int] = {}
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
        if not isinstance(op, dict) or isinstance(ts, bool) or not isinstance(ts, int | float):
            raise TraceError("an op row needs an 'op' object and a numeric 'ts'", n)
        name = op.get("op")
        if name == "admit":
            toks = op.get("token_ids")
            if (
                not isinstance(toks, list)
                or not toks
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in toks)
            ):
                raise TraceError("admit token_ids must be a non-empty list of ints >= 0", n)
            result = row.get("result")
            rid = result.get("request_id") if isinstance(result, dict) else None
            rid = op.get("request_id") if rid is None else rid
            t0 = float(ts) if t0 is None else t0
            if reqs and (float(ts) - t0) * 1000.0 < reqs[-1]["timestamp_ms"]:
                raise TraceError("operations must be in time order", n)
            for k in ("lora_name", "cache_salt"):
                if op.get(k) is not None and not isinstance(op.get(k), str):
                    raise TraceError(f"{k} must be a string", n)
            if isinstance(rid, str):
                running[rid] = len(reqs)
            reqs.append(
                {
                    "timestamp_ms": (float(ts) - t0) * 1000.0,
                    "token_ids": tuple(toks),
                    "lora_name": op.get("lora_name"),
                    "cache_salt": op.get("cache_salt"),
                    "output_length": 0,
                    "line": n,
                }
            )
        elif name == "append":
            i = running.get(op.get("request_id"))  # type: ignore[arg-type]
            toks = op.get("token_ids")
            if i is not None and isinstance(toks, list):
                reqs[i]["output_length"] += len(toks)
        elif name == "finish":
            running.pop(op.get("request_id"), None)  # type: ignore[arg-type]
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
                return json.loads(raw)
            except json.JSONDecodeError:
                return None
    return None


def parse_trace(text: str | bytes, tokens_per_id: int = TOKENS_PER_ID) -> Trace:
    """A Mooncake trace or a recording, told apart by the first line."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"not UTF-8 text (byte {exc.start})") from None
    first = _first_row(text)
    lines = text.splitlines()
    if isinstance(first, dict) and first.get("format") == RECORDING_FORMAT:
        return parse_recording(lines)
    return parse_mooncake(lines, tokens_per_id)


def read_trace(path: str | Path, tokens_per_id: int = TOKENS_PER_ID) -> Trace:
    """Read and validate a trace file (TraceError when it cannot be read)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_trace(data, tokens_per_id)
