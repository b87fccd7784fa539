"""What a stream client may send: strict parsing and a per-client budget.

- ``parse_seq``: a sequence number from a query string — ASCII digits only,
  at most 19 of them (``"²".isdigit()`` is true, ``int("²")`` raises).
- ``parse_message``: a client message, already known to be small (the
  websocket handler checks its size before this parses anything).
- ``TokenBucket``: resumes and snapshots a client may ask for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_SEQ = 2**63 - 1
_MAX_SEQ_DIGITS = len(str(MAX_SEQ))


def parse_seq(text: str | None) -> int | None:
    """A non-negative integer of ASCII digits, at most ``MAX_SEQ``; else None."""
    if not text or len(text) > _MAX_SEQ_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= MAX_SEQ else None


@dataclass(frozen=True)
class ClientRequest:
    kind: str  # "resume" | "snapshot"
    from_seq: int | None = None


def parse_message(text: str) -> ClientRequest | None:
    """``{"type": "resume", "from": N}`` or ``{"type": "snapshot"}``; None for
    anything else (not JSON, nested too deep, another type, a bad ``from``)."""
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(msg, dict):
        return None
    kind = msg.get("type")
    if kind == "snapshot":
        return ClientRequest("snapshot")
    seq = msg.get("from")
    # type() and not isinstance(): True is an int too
    if kind == "resume" and type(seq) is int and 0 <= seq <= MAX_SEQ:
        return ClientRequest("resume", seq)
    return None


@dataclass
class TokenBucket:
    """``burst`` requests at once, refilled at ``rate`` per second."""

    rate: float
    burst: float
    tokens: float
    at: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate, burst, burst, now)

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        """Seconds until the next request would be granted."""
        return max(0.0, (1.0 - self.tokens) / self.rate)
