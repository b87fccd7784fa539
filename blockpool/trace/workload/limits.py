"""What a trace may imply (``TraceLimits``), the error a bad one raises
naming its line and field (``TraceError``), and the line reading both
parsers share: JSON lines bounded in length, values shown cut short, the
running totals against the limits."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from blockpool.core.errors import BlockPoolError

MAX_LINE_BYTES = 16 * 1024 * 1024
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


def show_value(v: Any) -> str:
    """A value for an error message, cut short (a huge list or number stays readable)."""
    text = (
        repr(v)
        if not isinstance(v, int) or abs(v) < 10**30
        else f"an integer of {len(str(abs(v)))} digits"
    )
    return text if len(text) <= 80 else text[:77] + "..."


def json_lines(lines: Iterable[str | bytes]) -> Iterator[tuple[int, Any]]:
    for n, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"line longer than {MAX_LINE_BYTES} bytes", n)
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        yield n, loads_line(text, n)


def loads_line(text: str, line: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not JSON: {exc.msg} (column {exc.colno})", line) from None
    except RecursionError:
        raise TraceError("not JSON this service reads: nested too deeply", line) from None
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        raise TraceError(f"not JSON this service reads: {str(exc).split(';')[0]}", line) from None


class Totals:
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
