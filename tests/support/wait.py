"""Waiting on a condition, sync and async: poll until it holds, with a
deadline that only bounds a stuck wait (generous: the suite runs on loaded
machines), and an error naming what was awaited and what was seen last."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# An HTTP client's timeout in the suite: a request to a busy test server may
# wait behind a long engine step on a machine whose cores are all taken.
CLIENT_TIMEOUT = 60.0
# ... and how long it keeps an idle connection: well under the server's
# keep-alive (5 s), so that it never sends on one the server is closing at
# that moment ("Server disconnected without sending a response", CI on a
# loaded machine, a browser test's POST after its page's work)
CLIENT_KEEPALIVE_S = 1.0
# The default bound of a wait (not a timing check: a stuck wait fails after it).
WAIT_TIMEOUT = 60.0
POLL_S = 0.02


def _timed_out(timeout: float, what: str, last: Any) -> AssertionError:
    return AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def eventually(
    pred: Callable[[], T],
    timeout: float = WAIT_TIMEOUT,
    what: str = "condition",
    *,
    poll: float = POLL_S,
) -> T:
    """``pred()`` once it is truthy (polled every ``poll`` s); AssertionError
    after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, last)
        time.sleep(poll)


async def eventually_async(
    pred: Callable[[], T | Awaitable[T]], timeout: float = WAIT_TIMEOUT, what: str = "condition"
) -> T:
    """The async form: ``pred`` may be a plain or an async callable; the loop
    keeps running between polls."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        last: T = await got if inspect.isawaitable(got) else got  # type: ignore[assignment]
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, last)
        await asyncio.sleep(POLL_S)
