"""What the runtime is handed from outside, as the runtime sees it.

``PoolRuntime`` keeps a recorder (blockpool.analysis.recording's
``Recorder``: every operation, for time travel and export) and may write
each admitted request's K/V into a storage (the service's link to
blockpool.storage); neither is imported here -- the runtime sits below
both -- so each is named by what the runtime calls on it.
"""

from __future__ import annotations

from typing import Any, Protocol

from blockpool.core.manager import ManagedRequest
from blockpool.runtime.ops import Op


class OperationRecorder(Protocol):
    """Keeps every operation the runtime applies (and a keyframe when due)."""

    due: bool

    def record(
        self, op: Op, ok: bool, payload: dict[str, Any], first_event: int, n_events: int
    ) -> None:
        """``payload``: the operation's result, or its error's ``as_dict()``."""
        ...

    def keyframe(self) -> None: ...


class RequestStorage(Protocol):
    """Writes an admitted request's K/V from a token on."""

    def write_request(self, managed: ManagedRequest, start_token: int) -> None: ...
