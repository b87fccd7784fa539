"""The wait before trying again after a failure, doubled after each one up
to a bound, and back to the first after a success -- the plugin's sender
thread restarted, the mirror's resync asked again, the observer's socket
loop restarted, the stream client's reconnection."""

from __future__ import annotations


class Backoff:
    """``first`` seconds after a failure, twice that after the next, up to
    ``most``; ``reset`` after a success (or a try that ran long enough to
    count its failure as a fresh one)."""

    def __init__(self, first: float, most: float) -> None:
        if not 0 < first <= most:
            raise ValueError(f"a backoff needs 0 < first <= most, not {first} and {most}")
        self.first = first
        self.most = most
        self.next_s = first  # the wait the next failure gets

    def failed(self) -> float:
        """A failure: the wait before the next try (the one after doubles)."""
        wait = self.next_s
        self.next_s = min(self.most, wait * 2)
        return wait

    def reset(self) -> None:
        self.next_s = self.first
