"""Feeding shadow pools: record on the hot path, apply in batches.

On the runtime's hot path an operation only appends a tuple that references
the request's hash list (no copy: the list only ever grows).  At tick time
``flush`` slices the hashes each access needs and applies the batch to the
shadow pools (``blockpool.shadow.ShadowSet``) inline.  The service's process
feeder (app/analysis/shadows.py) sends the same batches to a worker process
instead.

Shadows see request traffic only (admit / append / finish / reset); raw
block operations are invisible to them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blockpool.core.free_order import APPEND_ALL
from blockpool.core.hashing import BlockHashListWithBlockSize
from blockpool.shadow import ShadowSet, ShadowSpec, policy_name


def shadow_specs(policies: list[str], factors: list[float], grid: bool) -> list[ShadowSpec]:
    """vLLM 0.16 (``append_all``) at every factor, every policy at 1x (or
    every pair: grid).  Policies by name; an old spelling is accepted."""
    policies = [policy_name(p) for p in policies]
    specs: list[ShadowSpec] = []
    if grid:
        specs.extend(
            ShadowSpec(p, f) for p in policies or [APPEND_ALL] for f in sorted({1.0, *factors})
        )
    else:
        specs.extend(
            ShadowSpec(APPEND_ALL, f)
            for f in sorted({*factors, *([1.0] if APPEND_ALL in policies else [])})
        )
        specs.extend(ShadowSpec(p, 1.0) for p in policies if p != APPEND_ALL)
    return list(dict.fromkeys(specs))


# a request's block hashes as a feeder is handed them: the manager's (a list,
# or its coarser view) or a mirror's records'; a flush slices them
PromptHashes = Sequence[bytes] | BlockHashListWithBlockSize


class FeedProgress:
    """What a shadow feeder reports of its progress, inline or through a
    worker: the resync id, accesses outstanding and applied, drops, resyncs,
    the last error, since when it runs and when it last heard."""

    def start_progress(self) -> None:
        self.cid = 0
        self.outstanding = 0
        self.applied = 0
        self.dropped = 0
        self.resyncs = 0
        self.error: str | None = None
        self.since = time.time()
        self.updated = 0.0

    @property
    def running(self) -> bool:
        return bool(self.cid)

    def status(self, mode: str, **figures: Any) -> dict[str, Any]:
        """The status every feeder reports, its own ``figures`` in the middle."""
        return {
            "mode": mode,
            "running": self.running,
            "since": self.since,
            "updated": self.updated or None,
            **figures,
            "resyncs": self.resyncs,
            "error": self.error,
        }


@dataclass(frozen=True)
class ShadowLayout:
    """The shadow pools a feeder keeps: one a spec, sized from the real
    pool's ``base_capacity`` blocks of ``block_size`` tokens, ``num_groups``
    KV-cache groups."""

    specs: list[ShadowSpec]
    base_capacity: int
    block_size: int
    num_groups: int


class ShadowFeeder(FeedProgress):
    """Inline: the shadows of ``layout`` live here and every flush applies at once."""

    mode = "inline"

    def __init__(self, layout: ShadowLayout, *, inline: bool = True) -> None:
        self.specs = layout.specs
        self.base_capacity = layout.base_capacity
        self.block_size = layout.block_size
        self.num_groups = layout.num_groups
        self.pending: list[tuple[Any, ...]] = []
        self.inline = (
            ShadowSet(layout.specs, layout.base_capacity, layout.block_size, layout.num_groups)
            if inline
            else None
        )
        self.latest: list[dict[str, Any]] | None = self.inline.stats() if self.inline else None
        self.latest_real: tuple[int, int] | None = None
        self.real_base = (0, 0)
        self.sent = 0
        self.start_progress()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    @property
    def running(self) -> bool:
        return self.inline is not None

    def wait_idle(self, timeout: float = 10.0) -> bool:  # noqa: ARG002 the worker-backed subclass's signature
        return True

    # ----------------------------------------------------- runtime hot path

    def admit(self, rid: str, num_tokens: int, hashes: PromptHashes) -> None:
        self.pending.append(("a", rid, num_tokens, hashes))

    def append(self, rid: str, before: int, after: int, hashes: PromptHashes) -> None:
        self.pending.append(("p", rid, before, after, hashes))

    def finish(self, rid: str) -> None:
        self.pending.append(("f", rid))

    def reset(self) -> None:
        self.pending.append(("r",))

    # ----------------------------------------------------------- tick time

    def _materialize(self, pending: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        bs = self.block_size
        out: list[tuple[Any, ...]] = []
        add = out.append
        for acc in pending:
            kind = acc[0]
            if kind == "a":
                n = acc[2]
                add(("a", acc[1], n, acc[3][: n // bs]))
            elif kind == "p":
                b, a = acc[2], acc[3]
                add(("p", acc[1], a, acc[4][b // bs : a // bs]))
            else:
                add(acc)
        return out

    def flush(self, real: tuple[int, int]) -> None:
        """Hand the accesses since the last flush to the shadows; ``real``:
        the real pool's prefix-cache (queries, hits) in tokens now."""
        pending = self.pending
        if not pending:
            return
        self.pending = []
        self._deliver(pending, real)

    def _deliver(self, pending: list[tuple[Any, ...]], real: tuple[int, int]) -> None:
        assert self.inline is not None
        self.inline.apply(self._materialize(pending))
        self.applied += len(pending)
        self.latest = self.inline.stats()
        self.latest_real = real
        self.updated = time.time()

    def settle(self, real: tuple[int, int]) -> None:
        """Nothing pending nor in flight: the shadows have seen every access,
        so ``real`` (the real pool's counters now) ends the span they are
        compared over.  A mirror's: its engine's counters arrive with its
        batches, after the records that fed the shadows."""
        if not self.pending and not self.outstanding:
            self.latest_real = real

    def restart(self, real: tuple[int, int]) -> None:
        """Every shadow empty again (e.g. after the real pool restarted)."""
        self.pending = []
        self.since = time.time()
        self.real_base = real
        self.latest_real = real
        if self.inline is not None:
            self.inline.restart()
            self.latest = self.inline.stats()

    def check(self, timeout: float = 10.0) -> None:  # noqa: ARG002 the worker-backed subclass's signature
        """Audit every shadow (tests)."""
        if self.inline is not None:
            for pool in self.inline.pools:
                pool.check()

    def figures(self) -> dict[str, Any]:
        return {
            "lag_accesses": self.outstanding + len(self.pending),
            "sent_accesses": self.sent if self.inline is None else self.applied,
            "applied_accesses": self.applied,
            "dropped_accesses": self.dropped,
        }

    def snapshot(self) -> dict[str, Any]:
        return self.status(self.mode, **self.figures())
