"""Letting the engine's thread back into the interpreter in time.

The plugin's thread works while vLLM's engine thread waits for its forward
pass.  When that pass ends, the engine's thread needs the interpreter (the
GIL) back -- and it cannot say so: a thread waiting for the GIL runs no
Python.  CPython hands it over only when the holder blocks, or after the
switch interval (5 ms by default) when the waiter forces it; a holder that
merely releases it for a moment (``sleep(0)``, a socket call) usually takes
it straight back.  So the plugin's thread *paces* itself: every
``EVERY_NS`` of work it sleeps ``SLEEP_S`` -- long enough for a waiting
thread to be woken and take the interpreter -- and then asks whether the
engine has come back.  The engine's wait for the interpreter is then about
``EVERY_NS`` plus one wake-up, never the switch interval.
"""

from __future__ import annotations

import ctypes
import sys
import time
from time import perf_counter_ns

EVERY_NS = 100_000  # work between two sleeps, at most (about)
SLEEP_S = 0.00002  # (~100 µs measured with Linux's default timer slack, ~40 µs with TIMER_SLACK_NS)
TIMER_SLACK_NS = 1_000  # the plugin's thread's own timer slack (Linux's default: 50 µs)
_PR_SET_TIMERSLACK = 29


def tighten_timer_slack() -> bool:
    """Make the calling thread's sleeps end when asked (Linux lets a
    thread's timers fire up to its *timer slack* late: 50 µs by default,
    most of a pacing sleep).  Only this thread's setting changes; whether it
    did (False off Linux or when the call is refused)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class Pacer:
    """Called between pieces of work on the plugin's thread: sleeps when
    ``every_ns`` passed since the last sleep (or ``rested``)."""

    __slots__ = ("every_ns", "last", "sleep_s", "sleeps")

    def __init__(self, every_ns: int = EVERY_NS, sleep_s: float = SLEEP_S) -> None:
        self.every_ns = every_ns
        self.sleep_s = sleep_s
        self.last = perf_counter_ns()
        self.sleeps = 0

    def __call__(self) -> bool:
        """Sleep if due; whether it slept (the engine may have moved)."""
        if perf_counter_ns() - self.last < self.every_ns:
            return False
        time.sleep(self.sleep_s)
        self.sleeps += 1
        self.last = perf_counter_ns()
        return True

    def rested(self) -> None:
        """The thread just blocked (waited for a turn): the interpreter was
        free, the count starts again."""
        self.last = perf_counter_ns()
