"""Shadow pools in the worker process: the library's feeder, sending its
batches to the one worker process of this server (``worker_client.py``).

The engine never waits: when more than ``max_lag`` accesses are in flight
the batch is dropped and the shadows restart empty (counted in ``resyncs``;
counters are "since" the restart) -- nothing is lost silently.  Mode
``inline`` uses the library's ShadowFeeder as it is.

On a mirror (``MirrorShadows``) the shadows are fed from the engine's
request records rather than the runtime's hooks (a mirror's pool sees only
block operations), in the engine's free order.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from app.analysis.worker_client import WorkerClient
from blockpool.analysis.feeder import ShadowFeeder, ShadowLayout, shadow_specs
from blockpool.analysis.views import shadow_rows, shadows_of
from blockpool.mirror.shadow_feed import MirrorShadowFeed
from blockpool.shadow import ShadowSpec

if TYPE_CHECKING:
    from app.shared.settings import Settings
    from blockpool.core.manager import PrefixCacheStats

logger = logging.getLogger("blockpool.analysis")

__all__ = [
    "MirrorShadows",
    "ProcessShadowFeeder",
    "ShadowFeeder",
    "ShadowLayout",
    "make_feeder",
    "shadow_specs",
]


class ProcessShadowFeeder(ShadowFeeder):
    """The shadows in the worker process: every flush is sent there through
    this feeder's ``worker`` link."""

    mode = "process"

    def __init__(self, layout: ShadowLayout, max_lag: int) -> None:
        super().__init__(layout, inline=False)
        self.worker = WorkerClient(self, max_lag)
        self.need_restart = False

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if not self.cid:
            specs = [(s.policy, s.factor) for s in self.specs]
            self.worker.open((specs, self.base_capacity, self.block_size, self.num_groups))

    def stop(self) -> None:
        self.worker.stop()

    @property
    def running(self) -> bool:
        return bool(self.cid)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        return self.worker.wait_idle(timeout)

    # ----------------------------------------------------------- tick time

    def _deliver(self, pending: list[tuple[Any, ...]], real: tuple[int, int]) -> None:
        if not self.cid or self.error:
            self.dropped += len(pending)
            return
        with self.worker.lock:
            over = self.outstanding + len(pending) > self.worker.max_lag
            if over:
                self.dropped += len(pending)
                self.need_restart = True
                return
            self.outstanding += len(pending)
        if self.need_restart:
            self.need_restart = False
            self.resyncs += 1
            self.since = time.time()
            self.real_base = real
            self.worker.send(("restart", self.cid))
        self.sent += len(pending)
        self.worker.send(("batch", self.cid, self._materialize(pending), real))

    def _reply(self, reply: dict[str, Any]) -> None:
        """Sender thread: one message was handled."""
        if reply.get("error"):
            self.error = reply["error"]
            logger.error("shadow worker: %s", self.error)
        with self.worker.lock:
            self.outstanding -= reply.get("n", 0)
        self.applied += reply.get("n", 0)
        if reply.get("stats") is not None:
            self.latest = reply["stats"]
            self.updated = time.time()
        if reply.get("real") is not None:
            self.latest_real = reply["real"]
        self.worker.replies += 1

    def _gone(self, error: str) -> None:
        """Sender thread: the worker is gone."""
        self.error = error

    def restart(self, real: tuple[int, int]) -> None:
        super().restart(real)
        if self.cid:
            self.worker.send(("restart", self.cid))

    def check(self, timeout: float = 10.0) -> None:
        """Audit every shadow in the worker, after everything sent so far."""
        if not self.cid:
            return
        self.worker.send(("check", self.cid))
        if not self.wait_idle(timeout):
            raise AssertionError("the shadow worker did not answer")
        if self.error:
            raise AssertionError(self.error)


def make_feeder(layout: ShadowLayout, mode: str, max_lag: int) -> ShadowFeeder:
    """``process``: in the worker process; ``inline``: on the engine."""
    if mode == "process":
        return ProcessShadowFeeder(layout, max_lag)
    return ShadowFeeder(layout)


class MirrorShadows:
    """What-if on a mirror: shadows in the engine's free order at every
    factor (other policies at 1x), fed from the engine's request records
    (``blockpool.mirror.shadow_feed``), their view beside the engine's own
    prefix-cache counters."""

    def __init__(self, settings: Settings, free_order: str, engine: str | None) -> None:
        factors = sorted({1.0, *settings.shadow_factors})
        specs = [ShadowSpec(free_order, f) for f in factors]
        specs += [ShadowSpec(p, 1.0) for p in settings.shadow_policies if p != free_order]
        self.capacity = settings.effective_num_blocks - 1  # (a mirror: the engine's blocks)
        mode = "inline" if settings.shadow_mode == "inline" else "process"
        layout = ShadowLayout(
            list(dict.fromkeys(specs)), self.capacity, settings.block_size, settings.num_groups
        )
        self.feeder = make_feeder(layout, mode, settings.shadow_max_lag)
        self.feed = MirrorShadowFeed(self.feeder, free_order, engine)

    def start(self) -> None:
        self.feeder.start()

    def stop(self) -> None:
        self.feeder.stop()

    def flush(self, stats: PrefixCacheStats) -> None:
        """Tick time: the accesses since the last flush to the shadows;
        ``stats``: the engine's prefix-cache counters now."""
        real = (stats.queries, stats.hits)
        self.feeder.flush(real)
        self.feeder.settle(real)

    def view(self, stats: PrefixCacheStats) -> dict[str, Any]:
        out = shadows_of(self.feeder, self.capacity, stats)
        out["fed"] = self.feed.describe()
        return out

    def stream_rows(self) -> list[list[Any]]:
        return shadow_rows(self.feeder)
