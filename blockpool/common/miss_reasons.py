"""The miss reasons: their names (the one list), their codes, the tally
every classifier counts them in (the service's analysis, the trace replays),
one request's miss reasons (``RequestMissCodes``), and the eviction causes an
``evicted`` miss points back to.

What each reason means: ``blockpool/analysis/miss_classifier.py``; ``skipped``
(the engine did not look the prompt up: vLLM's ``prompt_logprobs``) is a
mirrored engine's only (``blockpool/analysis/engine_misses.py``).  A trace replay
(no extra keys across its requests' first blocks, one request admitted at a
time, no reset) finds the first four, ``REPLAY_REASONS``.  An eviction's
cause: ``reuse`` (an allocation took the block), ``evict_op`` (the evict
operation), ``reset`` (a prefix-cache reset).
"""

from __future__ import annotations

from collections.abc import Container, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

REASONS = (
    "last_token",
    "block_size_floor",
    "cold",
    "evicted",
    "extra_keys",
    "chain_broken",
    "reset",
    "skipped",
)
HIT, LAST_TOKEN, FLOOR, COLD, EVICTED, EXTRA_KEYS, CHAIN_BROKEN, RESET_DROP, SKIPPED = range(9)
NUM_CODES = len(REASONS) + 1
CODE_NAMES = (None, *REASONS)
REPLAY_REASONS = REASONS[:4]


def first_unstored(hashes: Sequence[Any], lo: int, hi: int, stored: Container[Any]) -> int:
    """The first of ``hashes[lo:hi]`` never stored (``hi`` when all were):
    the hashes stored so far are a prefix of a chain, so a bisection finds it."""
    while lo < hi:
        mid = (lo + hi) // 2
        if hashes[mid] in stored:
            lo = mid + 1
        else:
            hi = mid
    return lo


class MissTally:
    """Prompt blocks per miss reason (``blocks[code]``, 0: hits) and the
    regrets: blocks stored again after their eviction."""

    __slots__ = ("blocks", "regret_blocks")

    def __init__(self) -> None:
        self.blocks = [0] * NUM_CODES
        self.regret_blocks = 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MissTally):
            return NotImplemented
        return (self.blocks, self.regret_blocks) == (other.blocks, other.regret_blocks)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MissTally({self.counts()}, regret_blocks={self.regret_blocks})"

    def add(self, hit: int, seen: int, full: int, last_token: int, partial: int) -> None:
        """A prompt of ``full`` full blocks whose first ``hit`` hit and whose
        first ``seen`` were stored before: ``last_token`` (0/1) of the block
        at ``hit`` was still cached but holds the last prompt token; the
        other blocks before ``seen`` were evicted since, those from ``seen``
        never stored; ``partial`` (0/1): it ends in a partial block."""
        self.blocks[HIT] += hit
        self.add_counts(last_token, partial, seen - hit - last_token, full - seen)

    def add_counts(self, last_token: int, floor: int, evicted: int, cold: int) -> None:
        """Blocks of the four reasons a replay finds (one prompt's, or the
        sums over prompts); each evicted one is a regret."""
        b = self.blocks
        b[LAST_TOKEN] += last_token
        b[FLOOR] += floor
        b[EVICTED] += evicted
        b[COLD] += cold
        self.regret_blocks += evicted

    def add_codes(self, codes: bytes) -> list[int]:
        """A prompt's per-block codes; their count per code."""
        counts = [codes.count(code) for code in range(NUM_CODES)]
        b = self.blocks
        for code, n in enumerate(counts):
            b[code] += n
        return counts

    def counts(self, names: Sequence[str] = REASONS) -> dict[str, int]:
        """``{reason: blocks}`` of ``names``."""
        b = self.blocks
        return {name: b[REASONS.index(name) + 1] for name in names}


class ReasonCounts(MutableMapping[str, int]):
    """A tally's blocks by reason name, for ``names`` (a live view: what is
    written goes to the tally)."""

    def __init__(self, tally: MissTally, names: Sequence[str] = REASONS) -> None:
        self.tally = tally
        self.names = tuple(names)

    def _code(self, name: str) -> int:
        if name not in self.names:
            raise KeyError(name)
        return REASONS.index(name) + 1

    def __getitem__(self, name: str) -> int:
        return self.tally.blocks[self._code(name)]

    def __setitem__(self, name: str, value: int) -> None:
        self.tally.blocks[self._code(name)] = value

    def __delitem__(self, name: str) -> None:
        raise TypeError("a reason's count can be changed, not removed")

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return repr(dict(self))


# ------------------------------------------------- eviction causes, one request

Tag = tuple[str | None, str | None]  # (lora name, cache salt)
CAUSES = ("reuse", "evict_op", "reset")
REUSE, EVICT_OP, RESET = range(3)


def evicted_count(evictions: list[int]) -> int:
    """Evictions proper (reuse and the evict operation): a prefix-cache reset
    drops every hash at once, which is neither pressure nor a regret."""
    return evictions[REUSE] + evictions[EVICT_OP]


@dataclass
class RequestMissCodes:
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
