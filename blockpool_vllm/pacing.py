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

Once the engine's thread is seen waiting for its pass, not for the
interpreter -- ``QUIET_SLEEPS`` sleeps in a row that ended on time: a thread
running Python would have taken the interpreter in them and held it past
their end -- the plugin's thread works ``LONG_EVERY_NS`` between two sleeps,
never past the plan's deadline for the pass (``until_ns``: by then it begins
no more work, blockpool_vllm/forward_pass.py): half its time asleep was half
its reading lost, and a digest reader at 524,288 blocks fell behind the
engine into sweeps of the whole pool (``make bench-gpu``, sync).  Only a
pass that ends before the plan (shorter than 85 % of the shortest of the
last ones) finds it in such a piece: the engine then waits for it, at most
that long.
"""

from __future__ import annotations

import ctypes
import sys
import time
from time import perf_counter_ns

EVERY_NS = 100_000  # work between two sleeps, at most (about)
BUSY_EVERY_NS = 1_000_000  # ... while the engine works (see the module doc)
SLEEP_S = 0.0001  # (136 µs p50, 187 µs p99 measured here with TIMER_SLACK_NS)
LONG_EVERY_NS = 1_000_000  # ... once the engine is seen waiting for its pass (module doc)
QUIET_SLEEPS = 2  # sleeps in a row on time that show it
ON_TIME_NS = 400_000  # a sleep that took longer: the engine ran Python meanwhile
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

    __slots__ = (
        "busy_every_ns",
        "every_ns",
        "idle_every_ns",
        "last",
        "long_every_ns",
        "quiet",
        "sleep_s",
        "sleeps",
        "until_ns",
    )

    def __init__(
        self,
        every_ns: int = EVERY_NS,
        sleep_s: float = SLEEP_S,
        busy_every_ns: int = BUSY_EVERY_NS,
        long_every_ns: int = LONG_EVERY_NS,
    ) -> None:
        self.every_ns = self.idle_every_ns = every_ns
        self.busy_every_ns = busy_every_ns
        self.long_every_ns = long_every_ns
        self.sleep_s = sleep_s
        self.last = perf_counter_ns()
        self.sleeps = 0
        self.quiet = 0  # sleeps in a row that ended on time
        self.until_ns = 0  # the plan's deadline for the pass (perf_counter_ns; 0: none)

    def due_at(self) -> int:
        """When the next sleep is due (perf_counter_ns): ``every_ns`` after
        the last, or -- the engine seen waiting for its pass -- up to
        ``long_every_ns`` after it while the plan's deadline is ahead."""
        soon = self.last + self.every_ns
        if self.quiet < QUIET_SLEEPS:
            return soon
        return min(self.last + self.long_every_ns, max(self.until_ns, soon))

    def due(self) -> bool:
        """Whether the next call sleeps."""
        return perf_counter_ns() >= self.due_at()

    def __call__(self) -> bool:
        """Sleep if due; whether it slept (the engine may have moved)."""
        now = perf_counter_ns()
        if now < self.due_at():
            return False
        time.sleep(self.sleep_s)
        self.sleeps += 1
        self.last = perf_counter_ns()
        self.quiet = self.quiet + 1 if self.last - now <= ON_TIME_NS else 0
        return True

    def busy(self, working: bool) -> None:
        """The engine works now (True: ``BUSY_EVERY_NS`` between two
        sleeps), or waits for its pass or is idle (``EVERY_NS``)."""
        self.every_ns = self.busy_every_ns if working else self.idle_every_ns

    def rested(self) -> None:
        """The thread just blocked (waited for a turn): the interpreter was
        free, the count starts again (and whether the engine waits for its
        pass is seen afresh)."""
        self.last = perf_counter_ns()
        self.quiet = 0
