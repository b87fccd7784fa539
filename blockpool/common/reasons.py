"""The eviction causes, and one request's miss reasons (``RequestMisses``);
the reasons' names and codes are in ``blockpool.common.miss_reasons``.

What each reason means, and how a block gets one: ``misses.py``.  An
eviction's cause: ``reuse`` (an allocation took the block), ``evict_op``
(the evict operation), ``reset`` (a prefix-cache reset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blockpool.common.miss_reasons import REASONS

Tag = tuple[str | None, str | None]  # (lora name, cache salt)
CAUSES = ("reuse", "evict_op", "reset")
REUSE, EVICT_OP, RESET = range(3)


def evicted_count(evictions: list[int]) -> int:
    """Evictions proper (reuse and the evict operation): a prefix-cache reset
    drops every hash at once, which is neither pressure nor a regret."""
    return evictions[REUSE] + evictions[EVICT_OP]


@dataclass
class RequestMisses:
    """Hit / miss reason per prompt block of one admitted request."""

    request_id: str
    ts: float
    num_tokens: int
    num_hit_blocks: int
    codes: bytes  # one per prompt block: 0 hit, else REASONS[code - 1]
    details: dict[int, Any] | None  # block index -> detail dict, or an eviction's ring serial
    lora_name: str | None = None
    cache_salt: str | None = None
    finished_ts: float | None = None
    rec: int = -1  # its record in the floor index

    def counts(self) -> dict[str, int]:
        c = self.codes
        return {name: c.count(code) for code, name in enumerate(REASONS, start=1) if code in c}
