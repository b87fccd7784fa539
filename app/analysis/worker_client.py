"""The analysis worker process and its clients' link to it.

One worker process per server process (``app.analysis.worker``, started with
``spawn``) serves every client: the shadow feeder (``shadows.py``) and the
remote analysis (``remote.py``).  A queue and a sender thread pickle each
message, send it and hand the worker's one reply back to the client it is
for (``_reply``), or tell every client the worker is gone (``_gone``).  A
client has a ``WorkerClient``: its channel's count of messages and replies.
"""

from __future__ import annotations

import atexit
import multiprocessing
import queue
import threading
import time
from typing import Any, Protocol


class _Hub:
    """The one worker process of this server process, and its sender thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: Any = None
        self.conn: Any = None
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.feeders: dict[int, WorkerOwner] = {}  # cid -> ProcessShadowFeeder or RemoteAnalysis
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

    def register(self, feeder: WorkerOwner, opening: tuple[Any, ...], kind: str = "open") -> int:
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


class WorkerOwner(Protocol):
    """What a link to the worker belongs to: figures (``FeedProgress``: its
    channel ``cid``, ``error``) and the two calls of the sender thread."""

    cid: int
    error: str | None

    def _reply(self, reply: dict[str, Any]) -> None: ...

    def _gone(self, error: str) -> None: ...


class WorkerClient:
    """One client's link to the worker: the owner's channel (``owner.cid``),
    the messages sent and replies read (each message gets one reply), and
    how far behind the worker may fall (``max_lag``; ``lock`` guards the
    owner's count of what is outstanding)."""

    def __init__(self, owner: WorkerOwner, max_lag: int) -> None:
        self.owner = owner
        self.max_lag = max_lag
        self.lock = threading.Lock()
        self.messages = 0  # sent to the worker (each gets one reply)
        self.replies = 0

    def open(self, opening: tuple[Any, ...], kind: str = "open") -> None:
        """A new channel; its opening message counts as the first sent."""
        self.messages = 1
        self.owner.cid = _hub.register(self.owner, opening, kind)

    def stop(self) -> None:
        if self.owner.cid:
            _hub.close(self.owner.cid)
            self.owner.cid = 0

    def send(self, msg: tuple[Any, ...]) -> None:
        self.messages += 1
        _hub.send(msg)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until the worker has answered everything sent (tests, bench)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.owner.error or self.replies >= self.messages:
                return True
            time.sleep(0.005)
        return False
