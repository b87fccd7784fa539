"""What a usual pool call leaves in the follower's ``ops`` -- the blocks it
gave, flat, in the one list of the step's calls -- and ``resolve``, which reads
them as the wire's operations (blockpool/mirror/protocol.py) off the engine's
thread.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from msgspec import Raw

from blockpool.mirror.protocol import (
    Allocate,
    Cache,
    Free,
    Reset,
    Touch,
    Unsupported,
    encode_record,
)

# what a usual call leaves in ``PoolFollower.ops``, for ``resolve``: its kind,
# how many blocks, then the blocks it gave -- ``KIND, n, *blocks`` -- or for a
# cache call ``CACHE, offset, group, n, m, *window, *request's hash chain``
# (the window ``n`` long, the chain ``m``: the usual call hashes every block
# of its window but the null block, its hash the chain's at ``offset`` + its
# place, blockpool_vllm/pool_hooks.py), in the step's one list: no object of
# its own for the garbage collector to count, and no hash read on the
# engine's thread.  (A tuple a call was: an engine too busy to give the
# sender's thread time held a thousand of them at once, queued, and its young
# collections doubled -- each walking the engine's young requests, 15-25 ms,
# measured.)
# Any other operation is a wire record of its own (one item).
ALLOCATE, FREE, TOUCH, CACHE = 0, 1, 2, 3
_id_of = attrgetter("block_id")
_is_null = attrgetter("is_null")
_BY_KIND: tuple[type[Allocate] | type[Free] | type[Touch], ...] = (Allocate, Free, Touch)


def count_ops(entries: list[Any]) -> int:
    """The operations ``entries`` hold (kept, or resolved: one each)."""
    n = i = 0
    end = len(entries)
    while i < end:
        e = entries[i]
        if e.__class__ is int:
            i += 5 + entries[i + 3] + entries[i + 4] if e == CACHE else 2 + entries[i + 1]
        else:
            i += 1
        n += 1
    return n


def resolve(
    entries: list[Any], pace: Callable[[], object] | None = None, encoded: bool = False
) -> tuple[list[Any], list[int]]:
    """The operations of one flush as the wire has them, and the block ids
    they named (-1: a reset, -2: a call not followed) for the digest.  The
    usual calls were kept as the blocks they gave (flat: see ``CACHE``) and
    are read here -- off the engine's thread when deferred, ``pace`` called
    between two calls' (a step naming thousands of blocks took 4.5 ms of
    the sender's thread here, measured: an engine back meanwhile would wait
    for the interpreter).  A block's id never changes, and what was kept
    was copied at the call: nothing here can change under it.

    ``encoded``: each operation as the wire's bytes (``msgspec.Raw``, which
    a batch encodes as they are: the same message), not a record -- the
    sender's thread holds a batch's operations until it has encoded the
    batch, and their id and hash lists were objects the engine's garbage
    collector counted (~30 a batch, hundreds for a prefill's, measured:
    they set off the engine's young collections, each walking its young
    requests' token lists, 15-50 ms at GPU scale).  Encoded one by one,
    each operation's lists are freed before the next is read."""
    ops: list[Any] = []
    keep = ops.append
    touched: list[int] = []
    i, end = 0, len(entries)
    while i < end:
        if pace is not None:
            pace()
        e = entries[i]
        if e.__class__ is int:
            if e == CACHE:
                off, group, n, m = entries[i + 1], entries[i + 2], entries[i + 3], entries[i + 4]
                window = i + 5  # then the chain at window + n
                chain = window + n
                blocks = entries[window:chain]
                first = 0
                if any(map(_is_null, blocks)):  # (never hashed: left out)
                    kept = [k for k in range(n) if not blocks[k].is_null]
                    first = kept[0] if kept else -1
                    blocks = [blocks[k] for k in kept]
                    hashes = [bytes(entries[chain + off + k]) for k in kept]
                else:
                    hashes = list(map(bytes, entries[chain + off : chain + off + n]))
                ids = list(map(_id_of, blocks))
                at = off + first - 1  # the parent's place in the chain kept
                parent = bytes(entries[chain + at]) if first >= 0 and at >= 0 else None
                op: Any = Cache(int(group), parent, ids, hashes)
                keep(Raw(encode_record(op)) if encoded else op)
                i = chain + m
            else:
                n = entries[i + 1]
                ids = list(map(_id_of, entries[i + 2 : i + 2 + n]))
                op = _BY_KIND[e](ids)
                keep(Raw(encode_record(op)) if encoded else op)
                i += 2 + n
            touched.extend(ids)
        else:
            keep(Raw(encode_record(e)) if encoded else e)
            if isinstance(e, Reset):
                touched.append(-1)
            elif isinstance(e, Unsupported):
                touched.append(-2)
            else:
                touched.extend(e.ids)
            i += 1
    return ops, touched
