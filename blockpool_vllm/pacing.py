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

How long "long enough" is was measured (vLLM 0.32's scheduler at 524,288
blocks, ``make bench-gpu``): with 20 µs sleeps the engine's thread, woken
when its forward pass ended, lost the race for the interpreter to the
plugin's thread waking from its sleep, again and again, on this 2-core VM:
back late by 4.4-12 ms at p99 (0.17 ms without the plugin), and a
collection of the garbage collector that ran a finalizer lost it too
(young collections of 33-58 ms).  With 100 µs sleeps: late p99 0.14 ms,
the collections as without the plugin.

While the engine works -- it never waits for its passes (``AsyncScheduler``
on a CPU too slow for its GPU), so the plugin's thread took a turn overdue
-- the engine holds the interpreter and the plugin's thread gets it back
only when the engine is made to let go (the switch interval): a sleep
every 100 µs then gave the plugin's thread 100 µs of every 5 ms, too
little to send the engine's batches (1,500 queued after 3,000 steps,
measured).  Then it works ``BUSY_EVERY_NS`` between two sleeps: an engine
step delayed by at most that (an async run's batches sent: 580-963 of 961
in six runs, against 431-438).
"""

from __future__ import annotations

import ctypes
import sys
import time
from time import perf_counter_ns

EVERY_NS = 100_000  # work between two sleeps, at most (about)
BUSY_EVERY_NS = 1_000_000  # ... while the engine works (see the module doc)
SLEEP_S = 0.0001  # (136 µs p50, 187 µs p99 measured here with TIMER_SLACK_NS)
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
    ``every_ns`` passed since the last sleep (or ``rested``).  ``busy``
    says whether the engine is working (see the module doc)."""

    __slots__ = ("busy_every_ns", "every_ns", "idle_every_ns", "last", "sleep_s", "sleeps")

    def __init__(
        self, every_ns: int = EVERY_NS, sleep_s: float = SLEEP_S, busy_every_ns: int = BUSY_EVERY_NS
    ) -> None:
        self.every_ns = self.idle_every_ns = every_ns
        self.busy_every_ns = busy_every_ns
        self.sleep_s = sleep_s
        self.last = perf_counter_ns()
        self.sleeps = 0

    def due(self) -> bool:
        """Whether the next call sleeps."""
        return perf_counter_ns() - self.last >= self.every_ns

    def __call__(self) -> bool:
        """Sleep if due; whether it slept (the engine may have moved)."""
        if perf_counter_ns() - self.last < self.every_ns:
            return False
        time.sleep(self.sleep_s)
        self.sleeps += 1
        self.last = perf_counter_ns()
        return True

    def busy(self, working: bool) -> None:
        """The engine works now (True: ``BUSY_EVERY_NS`` between two
        sleeps), or waits for its pass or is idle (``EVERY_NS``)."""
        self.every_ns = self.busy_every_ns if working else self.idle_every_ns

    def rested(self) -> None:
        """The thread just blocked (waited for a turn): the interpreter was
        free, the count starts again."""
        self.last = perf_counter_ns()
