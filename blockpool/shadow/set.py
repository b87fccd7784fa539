"""ShadowSet: several shadow pools fed from one batch of accesses.

An access is a plain tuple (cheap to build, to pickle and to send to another
process):

    ("a", request_id, num_tokens, hashes)      admit (hashes of the full blocks)
    ("p", request_id, num_tokens, new_hashes)  decode growth (newly full blocks)
    ("f", request_id)                          finish
    ("r",)                                     prefix-cache reset
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from blockpool.shadow.pool import ShadowPool, make_shadow

Access = tuple[Any, ...]


@dataclass(frozen=True)
class ShadowSpec:
    """A shadow pool to run: a policy at ``factor`` times the real capacity."""

    policy: str
    factor: float

    @property
    def name(self) -> str:
        return f"{self.policy}@{self.factor:g}x"


class ShadowSet:
    def __init__(
        self,
        specs: Iterable[ShadowSpec],
        base_capacity: int,
        block_size: int,
        num_groups: int = 1,
    ) -> None:
        self.specs = list(dict.fromkeys(specs))
        self.base_capacity = base_capacity
        self.block_size = block_size
        self.num_groups = num_groups
        self.accesses = 0
        self.pools: list[ShadowPool] = []
        self.restart()

    def restart(self) -> None:
        """Every shadow empty again, counters at zero."""
        self.pools = [
            make_shadow(
                s.policy,
                max(1, round(self.base_capacity * s.factor)),
                self.block_size,
                self.num_groups,
                s.factor,
            )
            for s in self.specs
        ]
        self.accesses = 0

    def apply(self, batch: Sequence[Access]) -> None:
        for pool in self.pools:
            admit, append, finish, reset = pool.admit, pool.append, pool.finish, pool.reset
            for acc in batch:
                kind = acc[0]
                if kind == "a":
                    admit(acc[1], acc[3], acc[2])
                elif kind == "p":
                    append(acc[1], acc[2], acc[3])
                elif kind == "f":
                    finish(acc[1])
                elif kind == "r":
                    reset()
        self.accesses += len(batch)

    def stats(self) -> list[dict[str, Any]]:
        out = []
        for spec, pool in zip(self.specs, self.pools, strict=True):
            d = pool.stats.as_dict()
            d.update(
                name=spec.name,
                policy=spec.policy,
                factor=spec.factor,
                capacity=pool.capacity,
                running=len(pool.requests),
                free=pool.num_free,
            )
            out.append(d)
        return out
