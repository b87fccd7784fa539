"""Which run of the engine the mirror follows.

Every message the plugin sends carries the ``boot`` of its run.  A new boot
is the engine restarted; what an earlier run left queued is stale, dropped
unread by the client (app/mirror/client.py), whose runs are kept here.
"""

from __future__ import annotations

from collections import deque

RUNS_KEPT = 64  # earlier runs remembered (their messages: stale)


class EngineRuns:
    def __init__(self, kept: int = RUNS_KEPT) -> None:
        self.boot: str | None = None  # the run followed (None: none heard yet)
        self._earlier: deque[str] = deque(maxlen=kept)

    def is_earlier(self, boot: str) -> bool:
        """Whether ``boot`` is a run the mirror followed before this one."""
        return boot in self._earlier

    def follow(self, boot: str) -> bool:
        """Follow ``boot`` from now; whether that is a restart (another run
        was followed: it is earlier from now on)."""
        if boot == self.boot:
            return False
        restarted = self.boot is not None
        if self.boot is not None:
            self._earlier.append(self.boot)
        self.boot = boot
        return restarted
