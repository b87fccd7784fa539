"""analysis_mode="worker": the analysis runs on a live replica of the pool in
the worker process; the engine only records.

The engine already encodes every operation for the recording (one msgpack
blob each).  At tick time the blobs recorded since the last tick go to the
worker process (``app.analysis.worker``), which holds a replica runtime --
restored from a keyframe taken when the analysis started -- and applies the
same operations to it, with the analysis hooks on (miss reasons, regret,
queue travel) and the shadow pools inline.  Replay is exact (the history
tests prove it: same block ids, queue order, map, events), so the replica's
answers are the engine's; its clock is each operation's recorded time.

After each batch the worker sends back what the engine serves without
asking: the stream section, the Prometheus figures, and the miss reasons of
the requests admitted in the batch (for ``GET /api/requests/{id}``).  Detail
queries (``/api/misses``, ``/api/regret``, ``/api/shadows``, one request's
misses) are asked of the worker after the pending operations are sent, so
they see every operation up to the question.

The engine never waits for the worker: when more than ``shadow_max_lag``
operations are in flight, the batch is dropped and the replica restarts from
a new keyframe (``resyncs``; its counters restart).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from app.analysis.worker_client import WorkerClient
from app.shared.errors import NotFound, OperationError, Unavailable
from blockpool.analysis.feeder import FeedProgress
from blockpool.runtime.state import snapshot

if TYPE_CHECKING:
    from blockpool.analysis.recording import Recorder
    from blockpool.runtime.runtime import PoolRuntime

REASONS_KEPT = 10_000
QUERY_TIMEOUT_S = 30.0


class RemoteAnalysis(FeedProgress):
    def __init__(
        self, rt: PoolRuntime, opening: dict[str, Any], recorder: Recorder, max_lag: int
    ) -> None:
        self.start_progress()
        self.worker = WorkerClient(self, max_lag)
        self.engine = rt
        self.opening = opening  # what the worker builds its replica from (Replica)
        self.recorder = recorder
        self.sent_seq = 0
        self.need_resync = False
        self.stream: dict[str, Any] | None = None
        self.prom: dict[str, Any] | None = None
        # request id -> (reason codes, details): compact as the worker sends them
        self.reasons: OrderedDict[str, tuple[bytes, dict[int, Any]]] = OrderedDict()
        self._qids = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Between operations: the replica starts from the state now."""
        if self.cid:
            return
        self._open()

    def _open(self) -> None:
        e = self.engine
        rec = self.recorder
        kf = snapshot(e, rec.seq, time.time())
        opening = self.opening
        self.sent_seq = rec.seq
        self.worker.replies = 0
        self.outstanding = 0
        self.since = time.time()
        self.worker.open((opening, kf), kind="ropen")

    def stop(self) -> None:
        self.worker.stop()
        for loop, fut in list(self._waiting.values()):
            loop.call_soon_threadsafe(_fail, fut, Unavailable("the analysis worker stopped"))
        self._waiting.clear()

    # ------------------------------------------------------------ tick time

    def flush(self) -> None:
        """Send the operations recorded since the last flush."""
        if not self.cid:
            return
        rec = self.recorder
        if rec.seq == self.sent_seq and not self.need_resync:
            return
        if self.need_resync or rec.first_seq > self.sent_seq:
            # fell too far behind (or the recording dropped unsent operations)
            self.worker.stop()
            self.need_resync = False
            self.resyncs += 1
            self._open()
            return
        parts = rec.columns_between(self.sent_seq, rec.seq)
        n = sum(len(b) for _, b in parts)
        with self.worker.lock:
            if self.outstanding + n > self.worker.max_lag:
                self.dropped += n
                self.need_resync = True
                self.sent_seq = rec.seq
                return
            self.outstanding += n
        self.sent_seq = rec.seq
        self.worker.send(("rops", self.cid, parts))

    def pool_jumped(self) -> None:
        """Between operations, right after the engine's pool was put into
        another pool's state (a mirror's resync from the engine's snapshot):
        the operations recorded before it go to the replica, then the new
        state, so the replica's answers stay the pool's."""
        if not self.cid:
            return
        self.flush()
        if self.need_resync or not self.cid:
            return  # the next flush reopens the replica from the state then
        kf = snapshot(self.engine, self.recorder.seq, time.time())
        self.worker.send(("rresync", self.cid, kf))

    # -------------------------------------------------------------- replies

    def _reply(self, reply: dict[str, Any]) -> None:
        """Sender thread."""
        self.worker.replies += 1
        if reply.get("error") and reply.get("qid") is None:
            self.error = reply["error"]
        with self.worker.lock:
            self.outstanding -= reply.get("n", 0)
        self.applied += reply.get("n", 0)
        if reply.get("stream") is not None:
            self.stream = reply["stream"]
            self.prom = reply["prom"]
            self.updated = time.time()
        for rid, packed in (reply.get("reasons") or {}).items():
            self.reasons[rid] = packed
            self.reasons.move_to_end(rid)
        while len(self.reasons) > REASONS_KEPT:
            self.reasons.popitem(last=False)
        qid = reply.get("qid")
        if qid is not None:
            waiting = self._waiting.pop(qid, None)
            if waiting is not None:
                loop, fut = waiting
                loop.call_soon_threadsafe(_settle, fut, reply)

    def _gone(self, error: str) -> None:
        self.error = error
        for loop, fut in list(self._waiting.values()):
            loop.call_soon_threadsafe(_fail, fut, Unavailable(error))
        self._waiting.clear()

    # -------------------------------------------------------------- queries

    async def query(self, kind: str, **args: Any) -> dict[str, Any]:
        """Ask the replica (after every operation recorded so far)."""
        if not self.cid:
            raise Unavailable("the analysis worker is not running", error=self.error)
        self.flush()
        if not self.cid:
            raise Unavailable("the analysis worker is not running", error=self.error)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        qid = next(self._qids)
        self._waiting[qid] = (loop, fut)
        self.worker.send(("rquery", self.cid, qid, kind, args))
        try:
            reply = await asyncio.wait_for(fut, QUERY_TIMEOUT_S)
        finally:
            self._waiting.pop(qid, None)
        if reply.get("not_found"):
            raise NotFound(reply["not_found"], **reply.get("details", {}))
        if reply.get("error"):
            raise Unavailable(f"the analysis worker failed: {reply['error'][:300]}")
        result: dict[str, Any] = reply["result"]
        return result

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until the worker answered everything sent (tests, bench)."""
        return self.worker.wait_idle(timeout)

    def snapshot(self) -> dict[str, Any]:
        return self.status(
            "worker",
            lag_ops=self.outstanding + (self.recorder.seq - self.sent_seq),
            applied_ops=self.applied,
            dropped_ops=self.dropped,
        )


def _settle(fut: asyncio.Future[Any], reply: dict[str, Any]) -> None:
    if not fut.done():
        fut.set_result(reply)


def _fail(fut: asyncio.Future[Any], exc: OperationError) -> None:
    if not fut.done():
        fut.set_exception(exc)
