"""What ``/batch`` returns: one result per operation, in order.

The operations' own results are declared once, where the library builds
them (a ``TypedDict`` next to each operation's handler, e.g.
``blockpool.runtime.ops.allocate.Allocated``); the routes declare those.
"""

from __future__ import annotations

from typing import Any, NotRequired

from blockpool.common.shapes import TypedDict, shape


@shape
class BatchResult(TypedDict):
    ok: bool
    result: NotRequired[dict[str, Any] | None]
    """when ok"""
    error: NotRequired[dict[str, Any] | None]
    """the error, when refused"""
    skipped: NotRequired[bool | None]
    """after a refusal with on_error: stop"""


@shape
class Batch(TypedDict):
    """One result per operation, in order."""

    applied: int
    failed: int
    errors: bool
    results: list[BatchResult]
