"""Feeding shadow pools from the engine: record on the hot path, apply in batches.

On the engine's hot path an operation only appends a tuple that references
the request's hash list (no copy: the list only ever grows).  At tick time
``flush`` slices the hashes each access needs and hands the batch over:

* ``process`` (default): to one worker process per server process
  (``app.analysis.worker``, started with ``spawn``: ``worker_client.py``),
  through a queue and a sender thread that pickles, sends and reads the reply.  The engine never
  waits: when more than ``max_lag`` accesses are in flight the batch is
  dropped and the shadows restart empty (counted in ``resyncs``; counters
  are "since" the restart) -- nothing is lost silently.
* ``inline``: applied on the engine, in ``flush`` (tests, small pools).

Shadows see request traffic only (admit / append / finish / reset); raw
block operations are invisible to them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from app.analysis.worker_client import WorkerClient, _hub
from blockpool.shadow import ShadowSet, ShadowSpec

logger = logging.getLogger("blockpool.analysis")


class ShadowFeeder(WorkerClient):
    def __init__(
        self,
        specs: list[ShadowSpec],
        base_capacity: int,
        block_size: int,
        num_groups: int,
        mode: str,
        max_lag: int,
    ) -> None:
        super().__init__(max_lag)
        self.specs = specs
        self.base_capacity = base_capacity
        self.block_size = block_size
        self.num_groups = num_groups
        self.mode = mode
        self.pending: list[tuple[Any, ...]] = []
        self.inline = (
            ShadowSet(specs, base_capacity, block_size, num_groups) if mode == "inline" else None
        )
        self.latest: list[dict[str, Any]] | None = self.inline.stats() if self.inline else None
        self.latest_real: tuple[int, int] | None = None
        self.sent = 0
        self.need_restart = False
        self.real_base = (0, 0)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self.mode == "process" and not self.cid:
            specs = [(s.policy, s.factor) for s in self.specs]
            opening = (specs, self.base_capacity, self.block_size, self.num_groups)
            self.messages = 1
            self.cid = _hub.register(self, opening)

    @property
    def running(self) -> bool:
        return self.inline is not None or bool(self.cid)

    # ----------------------------------------------------- engine hot path

    def admit(self, rid: str, num_tokens: int, hashes: Any) -> None:
        self.pending.append(("a", rid, num_tokens, hashes))

    def append(self, rid: str, before: int, after: int, hashes: Any) -> None:
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
        if self.inline is not None:
            self.inline.apply(self._materialize(pending))
            self.applied += len(pending)
            self.latest = self.inline.stats()
            self.latest_real = real
            self.updated = time.time()
            return
        if not self.cid or self.error:
            self.dropped += len(pending)
            return
        with self.lock:
            over = self.outstanding + len(pending) > self.max_lag
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
            self._send(("restart", self.cid))
        self.sent += len(pending)
        self._send(("batch", self.cid, self._materialize(pending), real))

    def _reply(self, reply: dict[str, Any]) -> None:
        """Sender thread: one message was handled."""
        if reply.get("error"):
            self.error = reply["error"]
            logger.error("shadow worker: %s", self.error)
        with self.lock:
            self.outstanding -= reply.get("n", 0)
        self.applied += reply.get("n", 0)
        if reply.get("stats") is not None:
            self.latest = reply["stats"]
            self.updated = time.time()
        if reply.get("real") is not None:
            self.latest_real = reply["real"]
        self.replies += 1

    def restart(self, real: tuple[int, int]) -> None:
        """Every shadow empty again (e.g. after the real pool restarted)."""
        self.pending = []
        self.since = time.time()
        self.real_base = real
        if self.inline is not None:
            self.inline.restart()
            self.latest = self.inline.stats()
        elif self.cid:
            self._send(("restart", self.cid))

    def check(self, timeout: float = 10.0) -> None:
        """Audit every shadow (tests): inline at once, in the worker after
        everything sent so far."""
        if self.inline is not None:
            for pool in self.inline.pools:
                pool.check()
            return
        if not self.cid:
            return
        self._send(("check", self.cid))
        if not self.wait_idle(timeout):
            raise AssertionError("the shadow worker did not answer")
        if self.error:
            raise AssertionError(self.error)

    def snapshot(self) -> dict[str, Any]:
        return self._snapshot(
            self.mode,
            lag_accesses=self.outstanding + len(self.pending),
            sent_accesses=self.sent if self.inline is None else self.applied,
            applied_accesses=self.applied,
            dropped_accesses=self.dropped,
        )
