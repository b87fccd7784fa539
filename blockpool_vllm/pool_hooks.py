"""The pool's calls, followed: ``hook_pool`` wraps the pool *object's*
methods (its instance attributes: vLLM's classes and files are left as they
are) so that each call that changes it is kept, as it happens, in the
follower's ``ops`` -- an extend per call on the engine's thread, the pool
never walked (blockpool_vllm/follower.py).  The usual calls are kept as the
blocks they gave, read later off the engine's thread
(blockpool_vllm/call_records.py); the rest as typed operations.  While a
snapshot is copied (``Capture``), what a call is about to change is saved
first, under the follower's ``capture_lock``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from operator import attrgetter
from time import perf_counter_ns as _now
from typing import TYPE_CHECKING, Any

from blockpool.mirror.protocol import Cache, Evict, Reset
from blockpool_vllm.call_records import ALLOCATE, CACHE, FREE, TOUCH
from blockpool_vllm.capture import Capture

if TYPE_CHECKING:
    from blockpool_vllm.follower import PoolFollower

# The pool methods the follower wraps: each call becomes one operation.
WRAPPED = (
    "get_new_blocks",
    "free_blocks",
    "touch",
    "cache_full_blocks",
    "evict_blocks",
    "reset_prefix_cache",
)
# Pool methods that change it in ways the mirror does not model (vLLM >= 0.2x).
UNSUPPORTED_METHODS = ("cache_partial_block", "unpin_blocks", "move_block_hashes")
_hash_of = attrgetter("block_hash")
# cache_full_blocks's parameters in vLLM 0.16, and in >= 0.2x (a mask last)
_CACHE_ARGS = (
    "request",
    "blocks",
    "num_cached_blocks",
    "num_full_blocks",
    "block_size",
    "kv_cache_group_id",
)
CACHE_PARAMS = (_CACHE_ARGS, (*_CACHE_ARGS, "block_mask"))
_NO_MASK = {"block_mask": None}  # how vLLM >= 0.2x passes no mask


def hook_pool(self: PoolFollower) -> None:
    """Wrap ``self.pool``'s methods (its instance attributes): each call
    that changes the pool kept in ``self.ops`` as it happens (the usual
    ones as the blocks they gave: blockpool_vllm/call_records.py)."""
    pool = self.pool
    lock = self.capture_lock
    # the originals, in the order of WRAPPED
    get_new_blocks, free_blocks, touch, cache_full_blocks, evict_blocks, reset_prefix_cache = (
        getattr(pool, name) for name in WRAPPED
    )
    hash_block_size = pool.hash_block_size

    def _get_new_blocks(num_blocks: int) -> Any:
        # (the wrapper's time, the pool's own call left out; 0: not timed)
        t0 = _now() if self.timed else 0
        self.epoch += 1  # before the look at capture (poll_snapshot's check)
        cap = self.capture
        try:
            if cap is not None:
                with lock:
                    cap.save_head(num_blocks)
                    t1 = _now() if t0 else 0
                    ret = get_new_blocks(num_blocks)
            else:
                t1 = _now() if t0 else 0
                ret = get_new_blocks(num_blocks)
            t = _now() if t0 else 0
            if ret:
                kept = self.ops  # (the step's list: a flush takes it whole)
                kept.extend((ALLOCATE, len(ret)))  # flat, ids read later (resolve)
                kept.extend(ret)
                self.op_count += 1
            if t0:
                self.step_ns += _now() - t + t1 - t0
            return ret
        finally:
            self.epoch += 1

    def _blocks_call(
        kind: int, call: Callable[[list[Any]], None], save: Callable[[Capture, list[Any]], None]
    ) -> Callable[[Any], None]:
        """free_blocks and touch: a call over blocks, kept as one record."""

        def wrapper(some_blocks: Any) -> None:
            t0 = _now() if self.timed else 0
            blocks = list(some_blocks)
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            cap = self.capture
            try:
                if cap is not None:
                    with lock:
                        save(cap, blocks)
                        t1 = _now() if t0 else 0
                        call(blocks)
                else:
                    t1 = _now() if t0 else 0
                    call(blocks)
                t = _now() if t0 else 0
                if blocks:
                    kept = self.ops
                    kept.extend((kind, len(blocks)))
                    kept.extend(blocks)
                    self.op_count += 1
                if t0:
                    self.step_ns += _now() - t + t1 - t0
            finally:
                self.epoch += 1

        return wrapper

    def _save_freed(cap: Capture, blocks: list[Any]) -> None:
        cap.save_all(blocks)
        cap.save_ends()

    def _save_touched(cap: Capture, blocks: list[Any]) -> None:
        for b in blocks:
            cap.save_queued(b)

    _free_blocks = _blocks_call(FREE, free_blocks, _save_freed)
    _touch = _blocks_call(TOUCH, touch, _save_touched)

    def _cache_full_blocks(
        request: Any,
        blocks: Any,
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        *rest: Any,
        **kw: Any,
    ) -> None:
        t0 = _now() if self.timed else 0
        window = blocks[num_cached_blocks:num_full_blocks]
        # the usual call: blocks of the hash block size, no mask, none hashed
        # yet -- vLLM then hashes each of them but the null block, its hash the
        # request's (``CACHE``: read off the engine's thread, from the chain);
        # (the look at the hashes before is a loop in C, no list kept)
        usual = (
            block_size == hash_block_size
            and not rest
            and (not kw or kw == _NO_MASK)
            and not any(map(_hash_of, window))
        )
        # (the usual call's: none, so no list)
        before: list[Any] = [] if usual else [b.block_hash for b in window]
        self.epoch += 1  # before the look at capture (poll_snapshot's check)
        cap = self.capture
        try:
            args = (request, blocks, num_cached_blocks, num_full_blocks, block_size)
            if cap is not None:
                if usual:
                    before = [None] * len(window)
                with lock:
                    cap.save_all(window)
                    t1 = _now() if t0 else 0
                    cache_full_blocks(*args, kv_cache_group_id, *rest, **kw)
                    new = [b for b, old in zip(window, before, strict=True) if old is None]
                    cap.cached(
                        {bytes(b.block_hash) for b in new if b.block_hash is not None},
                        {b.block_id for b in new},
                    )
            else:
                t1 = _now() if t0 else 0
                cache_full_blocks(*args, kv_cache_group_id, *rest, **kw)
            t = _now() if t0 else 0
            if usual:
                if window:
                    start = num_cached_blocks - 1 if num_cached_blocks > 0 else 0
                    chain = request.block_hashes[start:num_full_blocks]
                    off, n = num_cached_blocks - start, len(window)
                    kept = self.ops
                    kept.extend((CACHE, off, kv_cache_group_id, n, len(chain)))
                    kept.extend(window)
                    kept.extend(chain)
                    self.op_count += 1
            else:
                cache_slowly(
                    self, request, window, before, num_cached_blocks, block_size, kv_cache_group_id
                )
            if t0:
                self.step_ns += _now() - t + t1 - t0
        finally:
            self.epoch += 1

    def _cache_usual(
        request: Any,
        blocks: Any,
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Any = None,
    ) -> None:
        """cache_full_blocks as vLLM declares it (``CACHE_PARAMS``): the usual
        call -- no mask, the hash block size, no snapshot being copied, none
        of the blocks hashed yet -- kept without packing its arguments again
        (bench/gpu_scale/forked.py --per-method, the same engine steps: a
        cache call's added time 2.9-3.2 -> 2.6 µs, ~17 calls a step); any
        other call handed to ``_cache_full_blocks``."""
        t0 = _now() if self.timed else 0
        if block_mask is None and block_size == hash_block_size:
            self.epoch += 1  # before the look at capture (poll_snapshot's check)
            try:
                window = blocks[num_cached_blocks:num_full_blocks]
                if self.capture is None and not any(map(_hash_of, window)):
                    t1 = _now() if t0 else 0
                    cache_full_blocks(
                        request,
                        blocks,
                        num_cached_blocks,
                        num_full_blocks,
                        block_size,
                        kv_cache_group_id,
                    )
                    t = _now() if t0 else 0
                    if window:
                        start = num_cached_blocks - 1 if num_cached_blocks > 0 else 0
                        chain = request.block_hashes[start:num_full_blocks]
                        kept = self.ops
                        off, n = num_cached_blocks - start, len(window)
                        kept.extend((CACHE, off, kv_cache_group_id, n, len(chain)))
                        kept.extend(window)
                        kept.extend(chain)
                        self.op_count += 1
                    if t0:
                        self.step_ns += _now() - t + t1 - t0
                    return
            finally:
                self.epoch += 1
        args = (request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id)
        if block_mask is None:
            _cache_full_blocks(*args)
        else:
            _cache_full_blocks(*args, block_mask=block_mask)

    def _evict_blocks(block_ids: Any) -> None:
        ids = list(block_ids)
        self.epoch += 1  # before the look at capture (poll_snapshot's check)
        cap = self.capture
        try:
            arg = set(ids) if isinstance(block_ids, set) else ids
            if cap is not None:
                with lock:
                    cap.save_ids(ids)
                    evict_blocks(arg)
            else:
                evict_blocks(arg)
            if ids:
                self.ops.append(Evict(ids))
                self.op_count += 1
        finally:
            self.epoch += 1

    def _reset_prefix_cache() -> bool:
        self.epoch += 1
        try:
            done: bool = reset_prefix_cache()
            if done:
                self.abandon_capture()
                self.ops.append(Reset())
                self.sync_due = True
                self.op_count += 1
            return done
        finally:
            self.epoch += 1

    wrappers = (
        _get_new_blocks,
        _free_blocks,
        _touch,
        _cache_usual if declared_as(cache_full_blocks, CACHE_PARAMS) else _cache_full_blocks,
        _evict_blocks,
        _reset_prefix_cache,
    )
    for name, wrapper in zip(WRAPPED, wrappers, strict=True):
        setattr(pool, name, wrapper)
    for name in UNSUPPORTED_METHODS:
        original = getattr(pool, name, None)
        if original is not None:
            setattr(pool, name, flagging(self, name, original))


def cache_slowly(
    self: PoolFollower,
    request: Any,
    window: list[Any],
    before: list[Any],
    num_cached_blocks: int,
    block_size: int,
    kv_cache_group_id: int,
) -> None:
    """A cache call over blocks some of which held a hash already (or a
    group whose block size is not the hash block size): read at once."""
    ids: list[int] = []
    hashes: list[bytes] = []
    first = -1
    for i, (blk, old) in enumerate(zip(window, before, strict=True)):
        new_hash = blk.block_hash
        if new_hash is None or new_hash == old:
            continue
        if old is not None:
            self.unsupported("a cached block re-hashed (partial-block caching)")
            return
        if first < 0:
            first = num_cached_blocks + i
        ids.append(blk.block_id)
        hashes.append(bytes(new_hash)[:-4])
    if ids:
        parent = None
        if first > 0:
            if block_size != self.pool.hash_block_size:
                self.unsupported("a group whose block size is not the hash block size")
                return
            parent = bytes(request.block_hashes[first - 1])
        self.ops.append(Cache(int(kv_cache_group_id), parent, ids, hashes))
        self.op_count += 1


def declared_as(method: Callable[..., Any], known: tuple[tuple[str, ...], ...]) -> bool:
    """Whether ``method`` takes exactly one of the ``known`` lists of
    parameters (plain ones; those past the shortest list defaulting to None)."""
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return False
    names = tuple(p.name for p in params)
    plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
    optional = params[min(map(len, known)) :]
    return plain and all(p.default is None for p in optional) and names in known


def flagging(self: PoolFollower, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kw: Any) -> Any:
        self.epoch += 1
        try:
            return original(*args, **kw)
        finally:
            self.unsupported(f"BlockPool.{name}")
            self.epoch += 1

    return call
