"""What the demo workload and the trace driver share: one background task
that feeds the engine, started once, cancelled and awaited on stop, and the
requests it left running finished (as one engine command) when asked."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from app.errors import ApiError
from app.schemas import FinishOp

if TYPE_CHECKING:
    from app.engine import Engine


R = TypeVar("R")


class WorkloadTask(Generic[R]):
    """A driver of ``engine``; ``running`` maps the ids of the requests it
    admitted (and has not finished) to its own record of each."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.running: dict[str, R] = {}
        self._name = name
        self._task: asyncio.Task[None] | None = None

    @property
    def running_task(self) -> bool:
        return self._task is not None and not self._task.done()

    def _spawn(self, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if not self.running_task:
            self._task = asyncio.create_task(loop(), name=self._name)

    async def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
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
            with contextlib.suppress(ApiError):
                self.engine.apply(FinishOp(request_id=rid))
