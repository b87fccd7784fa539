"""What the demo workload and the trace driver share: one background task
that feeds the engine, started once, cancelled and awaited on stop, and the
requests it left running finished (as one engine command) when asked.

One workload at a time: the workloads of one engine share a gate.  A start
while another workload's task runs is a 409 naming it; starts and stops made
through :meth:`WorkloadTask.transition` take the gate's lock, so a start
never lands inside a stop (whose cancel and finish await) and a stop never
loses the task it was asked to stop.  Both are idempotent: a start while
running, a stop while stopped change nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from app.pool.schemas import FinishOp
from app.shared.errors import Conflict, OperationError

if TYPE_CHECKING:
    from app.pool.engine import Engine

logger = logging.getLogger("blockpool.workload")

R = TypeVar("R")
S = TypeVar("S")  # its status: the response model its routes return

# task name -> (what it is, how to stop it): the 409 names the other workload
WORKLOADS = {
    "demo-workload": ("the demo workload", "POST /api/demo/stop"),
    "trace-replay": ("a trace replay", "POST /api/trace/stop"),
}


class _Gate:
    """The workloads of one engine: which may run, and the lock their
    starts and stops take."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.members: weakref.WeakSet[WorkloadTask[Any, Any]] = weakref.WeakSet()


_GATES: weakref.WeakKeyDictionary[Any, _Gate] = weakref.WeakKeyDictionary()


def _gate_of(engine: Any) -> _Gate:
    gate = _GATES.get(engine)
    if gate is None:
        gate = _GATES[engine] = _Gate()
    return gate


class WorkloadTask(Generic[R, S]):
    """A driver of ``engine``; ``running`` maps the ids of the requests it
    admitted (and has not finished) to its own record of each."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.running: dict[str, R] = {}
        self._name = name
        self._task: asyncio.Task[None] | None = None
        self._gate = _gate_of(engine)
        self._gate.members.add(self)

    @property
    def running_task(self) -> bool:
        return self._task is not None and not self._task.done()

    @contextlib.asynccontextmanager
    async def transition(self) -> AsyncIterator[None]:
        """Hold the engine's workload lock (a start or a stop, whole)."""
        async with self._gate.lock:
            yield

    def _other_running(self) -> WorkloadTask[Any, Any] | None:
        for other in list(self._gate.members):
            if other is not self and other.running_task:
                return other
        return None

    def ensure_startable(self) -> None:
        """Conflict when another workload of this engine runs."""
        other = None if self.running_task else self._other_running()
        if other is not None:
            what, stop = WORKLOADS.get(other._name, (other._name, "stop it"))
            raise Conflict(
                f"{what} is running: stop it first ({stop}); one workload at a time",
                running=other._name,
            )

    async def stop(self, finish_running: bool = True) -> None:
        raise NotImplementedError

    def status(self) -> S:
        raise NotImplementedError

    async def stop_now(self) -> S:
        """A stop under the workload lock (the stop routes); the status after."""
        async with self.transition():
            await self.stop()
        return self.status()

    def _spawn(self, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self.running_task:
            return  # already running: a start is idempotent
        self.ensure_startable()
        self._task = asyncio.create_task(loop(), name=self._name)
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.error("%s ended on an error: %r", self._name, exc, exc_info=exc)

    async def _cancel(self) -> None:
        """Cancel the task and wait until it is done; only the task this call
        took is forgotten (a start racing in between keeps its own)."""
        task = self._task
        if task is None:
            return
        while not task.done():
            task.cancel()
            # asyncio.wait neither raises the task's error nor eats our own
            # cancellation; a cancel swallowed by a race is asked for again
            await asyncio.wait({task}, timeout=1.0)
        if self._task is task:
            self._task = None

    async def _finish_running(self) -> None:
        """Finish every request still running, in one engine command."""
        if not self.running:
            return
        ids = list(self.running)
        self.running.clear()
        await self.engine.submit(lambda: self._finish_all(ids))

    def _finish_all(self, ids: list[str]) -> None:
        for rid in ids:
            with contextlib.suppress(OperationError):
                self.engine.apply(FinishOp(request_id=rid))
