"""What a usual pool call leaves in the follower's ``ops`` -- the blocks it
gave, in one flat tuple -- and ``resolve``, which reads them as the wire's
operations (blockpool/mirror/protocol.py) off the engine's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from blockpool.mirror.protocol import Allocate, Cache, Free, Op, Reset, Touch, Unsupported

# what a usual call leaves in ``PoolFollower.ops``, for ``resolve``: one flat
# tuple per call (the kind, then what it gave) -- one object for the garbage
# collector to count, not a tuple and its lists: the engine's collector runs
# no more often for the calls followed while the sender has not read them
ALLOCATE, FREE, TOUCH, CACHE = 0, 1, 2, 3
_BY_KIND: tuple[type[Allocate] | type[Free] | type[Touch], ...] = (Allocate, Free, Touch)


def resolve(
    entries: list[Any], pace: Callable[[], object] | None = None
) -> tuple[list[Op], list[int]]:
    """The operations of one flush as the wire has them, and the block ids
    they named (-1: a reset, -2: a call not followed) for the digest.  The
    usual calls were kept as the blocks they gave (``(kind, *blocks)``, or for
    a cache call ``(CACHE, offset, group, n, *window, *hashes after,
    *request's hash chain)``, the window and the hashes ``n`` long) and are
    read here -- off the engine's thread when deferred, ``pace`` called
    between two calls' (a step naming thousands of blocks took 4.5 ms of
    the sender's thread here, measured: an engine back meanwhile would wait
    for the interpreter).  A block's id never changes, and what was kept
    was copied at the call: nothing here can change under it."""
    ops: list[Op] = []
    touched: list[int] = []
    for e in entries:
        if pace is not None:
            pace()
        if e.__class__ is tuple:
            kind = e[0]
            if kind == CACHE:
                off, group, n = e[1], e[2], e[3]
                ids: list[int] = []
                hashes: list[bytes] = []
                first = -1
                for i in range(n):
                    h = e[4 + n + i]
                    if h is None:
                        continue
                    if first < 0:
                        first = i
                    ids.append(e[4 + i].block_id)
                    hashes.append(bytes(h)[:-4])
                at = off + first - 1  # the parent's place in the chain kept
                parent = bytes(e[4 + 2 * n + at]) if at >= 0 else None
                ops.append(Cache(int(group), parent, ids, hashes))
            else:
                ids = [b.block_id for b in e[1:]]
                ops.append(_BY_KIND[kind](ids))
            touched.extend(ids)
        else:
            ops.append(e)
            if isinstance(e, Reset):
                touched.append(-1)
            elif isinstance(e, Unsupported):
                touched.append(-2)
            else:
                touched.extend(e.ids)
    return ops, touched
