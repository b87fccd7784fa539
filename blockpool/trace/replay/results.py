"""Capacities and what a replay found at each.

A capacity is a pool of ``capacity_tokens // block_size`` blocks, the null
block included (vLLM's ``num_gpu_blocks``), so ``blocks - 1`` hold requests;
``None`` stands for ``inf``: a pool that never evicts.

Miss reasons (``blockpool.common.miss_reasons``; a replay finds four):
``cold`` (never stored at this capacity), ``evicted`` (stored before,
evicted since), ``last_token`` (cached, but it holds the prompt's last
token, which is always computed), ``block_size_floor`` (the partial tail
block: never hashed).
``regret_blocks``: blocks stored again after an eviction at this capacity.
A replay over sliding-window groups classifies no miss (``classified``
off): its JSON has ``miss_reasons`` and ``regret_blocks`` null and says why
(``blockpool/trace/replay/sequence_groups.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from blockpool.common.miss_reasons import REPLAY_REASONS, MissTally, ReasonCounts


def capacity_blocks(capacity_tokens: int | None, block_size: int) -> int | None:
    """Blocks of a pool holding ``capacity_tokens`` (None: unbounded)."""
    if capacity_tokens is None:
        return None
    return capacity_tokens // block_size


def parse_capacities(text: str) -> list[int | None]:
    """``"16384,65536,inf"`` -> ``[16384, 65536, None]`` (ValueError when bad)."""
    out: list[int | None] = []
    for part in text.split(","):
        p = part.strip().lower()
        if not p:
            continue
        if p in ("inf", "infinity", "unbounded"):
            out.append(None)
            continue
        try:
            v = float(p) if any(c in p for c in ".e") else int(p)
        except ValueError:
            raise ValueError(f"not a capacity: {part.strip()!r} (an integer or 'inf')") from None
        if not math.isfinite(v) or v != int(v) or v < 1:
            raise ValueError(f"a capacity must be a positive integer or 'inf', got {part!r}")
        out.append(int(v))
    if not out:
        raise ValueError("no capacity given")
    return out


@dataclass
class CapacityResult:
    """The counts of one replay at one capacity."""

    capacity_tokens: int | None
    blocks: int | None
    prompt_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0
    refused: int = 0
    refused_tokens: int = 0
    admitted: int = 0
    misses: MissTally = field(default_factory=MissTally)
    preemptions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    classified: bool = True  # miss reasons counted (not over sliding-window groups)

    @property
    def miss_reasons(self) -> ReasonCounts:
        """Prompt blocks per miss reason (``REPLAY_REASONS``), a view of ``misses``."""
        return ReasonCounts(self.misses, REPLAY_REASONS)

    @property
    def regret_blocks(self) -> int:
        return self.misses.regret_blocks

    @regret_blocks.setter
    def regret_blocks(self, n: int) -> None:
        self.misses.regret_blocks = n

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def counts(self) -> tuple[int, int, int]:
        """(hit tokens, evictions, refused): what replays must agree on."""
        return (self.hit_tokens, self.evictions, self.refused)

    def to_json(self) -> dict[str, Any]:
        return {
            "capacity_tokens": self.capacity_tokens,
            "blocks": self.blocks,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "evictions": self.evictions,
            "refused": self.refused,
            "refused_tokens": self.refused_tokens,
            "admitted": self.admitted,
            "miss_reasons": dict(self.miss_reasons) if self.classified else None,
            "regret_blocks": self.regret_blocks if self.classified else None,
            "preemptions": self.preemptions,
            **self.extra,
        }
