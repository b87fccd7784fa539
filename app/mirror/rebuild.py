"""The service rebuilt for an engine restarted as another pool.

An engine restarted with other blocks, block size, hash or free order cannot
be followed by this service's pool: no snapshot is asked of it.  Its new
handshake (taken: verified where keyed, of the engine run followed) is handed
to ``rebuild``, and ``serve`` rebuilds the whole service from it
(app/cli/commands.py).  Never for the handshake the service was built from
(a rebuild would build the same service again), and not without ``rebuild``:
then the status says to restart the mirror.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.mirror.status import MirrorStatus
from blockpool.mirror import protocol as wire

logger = logging.getLogger("blockpool.mirror")


def shape_of(hello: wire.Hello) -> tuple[int, int, str, str]:
    """What a service is built as from a handshake: its pool's shape."""
    return hello.num_gpu_blocks, hello.block_size, hello.hash_fn, hello.free_order


class ServiceRebuild:
    """``rebuild`` (None: none is possible), the handshake that sized the
    service (``built_from``) and the newest one handed to ``rebuild``
    (``rebuild_for``: what ``serve`` rebuilds from once the server stopped)."""

    def __init__(
        self, rebuild: Callable[[wire.Hello], None] | None, built_from: wire.Hello | None
    ) -> None:
        self.rebuild = rebuild
        self.built_from = built_from
        self.rebuild_for: wire.Hello | None = None

    def possible(self, hello: wire.Hello) -> bool:
        """Whether a service built from ``hello`` would be another pool than
        this one (built from ``built_from``): never for the handshake this
        service was built from, though it was not its pool's (then a rebuild
        would build the same service again)."""
        return self.rebuild is not None and (
            self.built_from is None or shape_of(hello) != shape_of(self.built_from)
        )

    def mismatch(self, hello: wire.Hello, mine: tuple[int, int, str, str]) -> str | None:
        """Why the engine's pool (``hello``) is not the mirror's, of shape
        ``mine`` (as ``shape_of``), and what follows (None: it is)."""
        theirs = shape_of(hello)
        if theirs == mine:
            return None
        n, block_size, hash_fn, free_order = mine
        return (
            f"the engine restarted with {hello.num_gpu_blocks} blocks of {hello.block_size} "
            f"tokens ({hello.hash_fn}, {hello.free_order}); the mirror follows {n} of "
            f"{block_size} ({hash_fn}, {free_order}): "
            + ("rebuilding the service" if self.possible(hello) else "restart the mirror")
        )

    def ask(self, hello: wire.Hello, status: MirrorStatus) -> None:
        """Hand the engine's new handshake to ``rebuild`` (where possible)."""
        if self.rebuild is None or not self.possible(hello):
            return
        first = self.rebuild_for is None
        self.rebuild_for = hello
        status.rebuilding = True
        if first:
            logger.warning(
                "mirror: the engine restarted as %d blocks of %d tokens: asking for a rebuild",
                hello.num_gpu_blocks,
                hello.block_size,
            )
        self.rebuild(hello)
