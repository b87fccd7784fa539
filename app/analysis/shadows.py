"""Feeding shadow pools from the engine: record on the hot path, apply in batches.

On the engine's hot path an operation only appends a tuple that references
the request's hash list (no copy: the list only ever grows).  At tick time
``flush`` slices the hashes each access needs and hands the batch over:

* ``process`` (default): to one worker process per server process
  (``app.analysis.worker``, started with ``spawn``), through a queue and a
  sender thread that pickles, sends and reads the reply.  The engine never
  waits: when more than ``max_lag`` accesses are in flight the batch is
  dropped and the shadows restart empty (counted in ``resyncs``; counters
  are "since" the restart) -- nothing is lost silently.
* ``inline``: applied on the engine, in ``flush`` (tests, small pools).

Shadows see request traffic only (admit / append / finish / reset); raw
block operations are invisible to them.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import queue
import threading
import time
from typing import Any

from blockpool.shadow import ShadowSet, ShadowSpec

logger = logging.getLogger("blockpool.analysis")


class _Hub:
    """The one worker process of this server process, and its sender thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: Any = None
        self.conn: Any = None
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.feeders: dict[int, Any] = {}  # cid -> ShadowFeeder or RemoteAnalysis
        self.next_cid = 0
        self.error: str | None = None

    def _start(self) -> None:
        # spawn, not fork (the server has threads): the child imports the
        # parent's __main__ as multiprocessing does, so a script that builds an
        # engine must keep its work under ``if __name__ == "__main__":``.
        from app.analysis import worker

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker.main, args=(child,), daemon=True, name="bp-shadows")
        proc.start()
        child.close()
        self.proc, self.conn, self.error = proc, parent, None
        self.queue = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=self._run, args=(self.queue, parent), name="bp-shadows-send", daemon=True
        )
        self.thread.start()

    def register(self, feeder: Any, opening: tuple[Any, ...], kind: str = "open") -> int:
        with self.lock:
            if self.proc is None or not self.proc.is_alive() or self.error:
                self._stop_locked()
                self._start()
            self.next_cid += 1
            cid = self.next_cid
            self.feeders[cid] = feeder
            self.queue.put((kind, cid, *opening))
            return cid

    def send(self, msg: tuple[Any, ...]) -> None:
        self.queue.put(msg)

    def close(self, cid: int) -> None:
        with self.lock:
            if self.feeders.pop(cid, None) is not None and self.proc is not None:
                self.queue.put(("close", cid))

    def _run(self, q: queue.SimpleQueue[Any], conn: Any) -> None:
        while True:
            msg = q.get()
            try:
                conn.send(msg)
                if msg is None:
                    return
                reply = conn.recv()
            except (EOFError, OSError, ValueError) as exc:
                self.error = f"the shadow worker is gone ({type(exc).__name__}: {exc})"
                for feeder in list(self.feeders.values()):
                    feeder._gone(self.error)
                return
            target = self.feeders.get(reply.get("cid"))
            if target is not None:
                target._reply(reply)

    def _stop_locked(self) -> None:
        proc, thread = self.proc, self.thread
        self.proc = self.thread = None
        if thread is not None and thread.is_alive():
            self.queue.put(None)
            thread.join(timeout=5)
        if proc is not None:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2)
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def shutdown(self) -> None:
        with self.lock:
            self._stop_locked()


_hub = _Hub()
atexit.register(_hub.shutdown)


def shutdown_worker() -> None:
    """Stop the shared worker process (it restarts on the next use)."""
    _hub.shutdown()


class ShadowFeeder:
    def __init__(
        self,
        specs: list[ShadowSpec],
        base_capacity: int,
        block_size: int,
        num_groups: int,
        mode: str,
        max_lag: int,
    ) -> None:
        self.specs = specs
        self.base_capacity = base_capacity
        self.block_size = block_size
        self.num_groups = num_groups
        self.mode = mode
        self.max_lag = max_lag
        self.pending: list[tuple[Any, ...]] = []
        self.inline = (
            ShadowSet(specs, base_capacity, block_size, num_groups) if mode == "inline" else None
        )
        self.cid = 0
        self.lock = threading.Lock()
        self.outstanding = 0
        self.latest: list[dict[str, Any]] | None = self.inline.stats() if self.inline else None
        self.latest_real: tuple[int, int] | None = None
        self.applied = 0
        self.sent = 0
        self.dropped = 0
        self.resyncs = 0
        self.need_restart = False
        self.error: str | None = None
        self.since = time.time()
        self.updated = 0.0
        self.real_base = (0, 0)
        self.messages = 0  # sent to the worker (each gets one reply)
        self.replies = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self.mode == "process" and not self.cid:
            specs = [(s.policy, s.factor) for s in self.specs]
            opening = (specs, self.base_capacity, self.block_size, self.num_groups)
            self.messages = 1
            self.cid = _hub.register(self, opening)

    def stop(self) -> None:
        if self.cid:
            _hub.close(self.cid)
            self.cid = 0

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

    def _send(self, msg: tuple[Any, ...]) -> None:
        self.messages += 1
        _hub.send(msg)

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

    def _gone(self, error: str) -> None:
        self.error = error

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

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until the worker has applied everything sent (tests, bench)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error or self.replies >= self.messages:
                return True
            time.sleep(0.005)
        return False

    def snapshot(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "running": self.running,
            "since": self.since,
            "updated": self.updated or None,
            "lag_accesses": self.outstanding + len(self.pending),
            "sent_accesses": self.sent if self.inline is None else self.applied,
            "applied_accesses": self.applied,
            "dropped_accesses": self.dropped,
            "resyncs": self.resyncs,
            "error": self.error,
        }
