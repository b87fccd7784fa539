"""Each phase's elapsed time, printed as it ends, and the total."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


def say(msg: str) -> None:
    print(f"[demo-check] {msg}", flush=True)


class Phases:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.times: list[tuple[str, float, bool]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        say(f"--- {name}")
        t0 = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            dt = time.monotonic() - t0
            self.times.append((name, dt, ok))
            say(f"--- {name}: {'ok' if ok else 'FAILED'} in {dt:.1f} s")

    def report(self) -> None:
        for name, dt, ok in self.times:
            say(f"{dt:8.1f} s  {'ok    ' if ok else 'FAILED'}  {name}")
        say(f"{time.monotonic() - self.started:8.1f} s  total")
