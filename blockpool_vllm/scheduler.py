"""``MirrorScheduler``: vLLM's own scheduler, followed by a blockpool mirror.

Start vLLM with ``--scheduler-cls blockpool_vllm.scheduler.MirrorAsyncScheduler``
(``MirrorScheduler`` where the engine runs ``--no-async-scheduling``)
and ``BLOCKPOOL_MIRROR_ENDPOINT=tcp://127.0.0.1:5590`` in its environment
(without the variable the subclass is vLLM's scheduler, unchanged).  In the
engine-core process it follows the KV-cache manager's block pool
(blockpool_vllm/follower.py) and publishes one batch per scheduler call on
that endpoint; the control socket (snapshots) is the next port.  With data
parallelism rank r uses the ports + 2r.

Environment (read here, in the engine, never by blockpool's library):

* ``BLOCKPOOL_MIRROR_ENDPOINT``   the PUB endpoint (``tcp://HOST:PORT``, loopback
  advised; ``*`` binds every interface)
* ``BLOCKPOOL_MIRROR_CONTROL``    the snapshot endpoint (default: the next port)
* ``BLOCKPOOL_MIRROR_DIGEST_EVERY``  the pool's digest on every Nth batch (1: each;
  it costs O(blocks the step touched)); only with the next set to 0
* ``BLOCKPOOL_MIRROR_DEFER_DIGEST``  1 (the default): the digest is taken off the
  engine's thread, by the sender's thread, riding on a later batch or beat;
  the sender's thread works only in the engine's forward passes -- from the
  end of ``schedule()`` to the scheduler's next hook -- or while it is idle,
  and lets go of the pool the moment the engine comes back
  (``ForwardPasses.wait_turn``); behind, or after a reset, the digest is
  rebuilt in pieces there (blockpool/mirror/digest_sweep.py).  An engine that
  never waits still has its stream every 0.25 s or 64 batches.  0: the digest
  is brought up to date on the engine's thread at every flush (~1-2 µs per
  block the step touched; README)
* ``BLOCKPOOL_MIRROR_QUEUE``      batches queued for the sender before drops (4096)
* ``BLOCKPOOL_MIRROR_NAME``       the engine's name in the handshake
* ``BLOCKPOOL_MIRROR_TOKEN_FILE`` a file whose first line (16 characters or more)
  is the stream's shared secret (blockpool/mirror/auth.py): every message is
  signed with it, only signed snapshot requests are answered, and the
  handshake says ``authenticated``.  Give the mirror the same file.  A file
  that cannot be read or holds too short a secret is logged and the engine
  runs unfollowed (never unsigned when a secret was asked for).

The plugin never takes the engine down: any failure while it starts is
logged and vLLM's scheduler runs unfollowed, its pool's methods vLLM's own;
a port in use is logged and bound in the background (blockpool_vllm/sender.py
retries every 5 s, dropping the batches meanwhile); the sender's thread is
supervised (blockpool_vllm/sender.py says what bounds it).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from typing import Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from blockpool.mirror.auth import SecretError, StreamKey
from blockpool.mirror.digest import SCHEME
from blockpool.mirror.protocol import (
    PROTOCOL,
    Arrive,
    Finished,
    Group,
    Hello,
    Preempted,
    Scheduled,
)
from blockpool_vllm.engine_facts import free_order_for, problems_of, served_model
from blockpool_vllm.follower import PoolFollower
from blockpool_vllm.pool_hooks import UNSUPPORTED_METHODS, WRAPPED
from blockpool_vllm.sender import Sender, next_port

logger = logging.getLogger("blockpool_vllm")

ENV_ENDPOINT = "BLOCKPOOL_MIRROR_ENDPOINT"
ENV_TOKEN_FILE = "BLOCKPOOL_MIRROR_TOKEN_FILE"
_MISSING = object()


def _shift(endpoint: str, by: int) -> str:
    for _ in range(by):
        endpoint = next_port(endpoint)
    return endpoint


class _Mirrored:
    """The hooks, for either of vLLM's scheduler classes (see the module doc)."""

    kv_cache_manager: Any
    vllm_config: Any
    kv_cache_config: Any
    block_size: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mirror: PoolFollower | None = None
        self._mirror_sender: Sender | None = None
        endpoint = os.environ.get(ENV_ENDPOINT)
        if endpoint:
            self._start_unbreakable(endpoint)

    # ------------------------------------------------------------ set-up

    def _start_unbreakable(self, endpoint: str) -> None:
        """``_start_mirror`` inside an error boundary: on any failure vLLM's
        scheduler is left as it was (its pool's and manager's methods vLLM's
        own again), unfollowed, and the engine starts."""
        mgr = getattr(self, "kv_cache_manager", None)
        pool = getattr(mgr, "block_pool", None)
        saved: list[tuple[Any, str, Any]] = []
        for obj, names in (
            (pool, (*WRAPPED, *UNSUPPORTED_METHODS)),
            (mgr, ("make_prefix_cache_stats", "free")),
        ):
            if obj is not None:
                saved += [(obj, n, _own_attribute(obj, n)) for n in names]
        try:
            self._start_mirror(endpoint)
        except Exception:
            logger.exception("blockpool mirror: the plugin failed to start; vLLM runs unfollowed")
            sender, self._mirror, self._mirror_sender = self._mirror_sender, None, None
            if sender is not None:
                try:
                    sender.close()
                except Exception:
                    logger.exception("blockpool mirror: closing the sender failed")
            for obj, name, before in saved:
                try:
                    if before is _MISSING:
                        if _own_attribute(obj, name) is not _MISSING:
                            delattr(obj, name)
                    else:
                        setattr(obj, name, before)
                except Exception:
                    logger.exception("blockpool mirror: could not restore %s", name)

    def _start_mirror(self, endpoint: str) -> None:
        key: StreamKey | None = None
        token_file = os.environ.get(ENV_TOKEN_FILE)
        if token_file:
            try:
                key = StreamKey.from_file(token_file)
            except SecretError as exc:
                logger.error(
                    "blockpool mirror: %s; %s is set, so nothing is published unsigned: "
                    "vLLM runs unfollowed",
                    exc,
                    ENV_TOKEN_FILE,
                )
                return
        mgr = self.kv_cache_manager
        pool = mgr.block_pool
        rank = int(getattr(self.vllm_config.parallel_config, "data_parallel_rank", 0) or 0)
        control = os.environ.get("BLOCKPOOL_MIRROR_CONTROL") or next_port(endpoint)
        endpoint, control = _shift(endpoint, 2 * rank), _shift(control, 2 * rank)
        totals = [0, 0, 0]
        boot = secrets.token_hex(8)
        make_stats = mgr.make_prefix_cache_stats

        def counted_stats() -> Any:
            st = make_stats()
            if st is not None:
                totals[0] += st.requests
                totals[1] += st.queries
                totals[2] += st.hits
            return st

        mgr.make_prefix_cache_stats = counted_stats
        deferred = os.environ.get("BLOCKPOOL_MIRROR_DEFER_DIGEST", "1") != "0"
        follower = PoolFollower(
            pool,
            lambda b: sender.offer(b),
            digest_every=int(os.environ.get("BLOCKPOOL_MIRROR_DIGEST_EVERY", "1")),
            boot=boot,
            stats=lambda: (totals[0], totals[1], totals[2]),
            # the digest off the engine's thread (0: on it, at each flush)
            defer_digest=deferred,
            # deferred: the sender's thread works in the engine's forward passes
            # only (the hooks below say when they run)
            windowed=deferred,
            pipelined=isinstance(self, AsyncScheduler),
        )
        free = mgr.free

        def free_request(request: Any) -> Any:
            rid, now = str(request.request_id), time.time()
            if request.is_finished():
                follower.request(Finished(rid, now, int(request.num_tokens)))
            else:
                follower.request(Preempted(rid, now))
            return free(request)

        mgr.free = free_request
        version = str(vllm.__version__)
        cache = self.vllm_config.cache_config
        groups = [
            Group(i, type(g.kv_cache_spec).__name__, int(g.kv_cache_spec.block_size))
            for i, g in enumerate(self.kv_cache_config.kv_cache_groups)
        ]
        transfer = self.vllm_config.kv_transfer_config
        hash_fn = str(getattr(cache, "prefix_caching_hash_algo", "sha256"))
        problems = problems_of(
            version,
            groups,
            enable_caching=bool(cache.enable_prefix_caching),
            block_size=int(self.block_size),
            hash_block_size=int(pool.hash_block_size),
            kv_connector=getattr(transfer, "kv_connector", None) if transfer else None,
            hash_fn=hash_fn,
        )
        problems.extend(follower.problems)
        started = time.time()
        model = served_model(self.vllm_config)
        name = os.environ.get("BLOCKPOOL_MIRROR_NAME") or f"{socket.gethostname()}:{os.getpid()}"

        def hello() -> Hello:
            return Hello(
                protocol=PROTOCOL,
                engine_id=name if not rank else f"{name}/dp{rank}",
                vllm_version=version,
                num_gpu_blocks=int(pool.num_gpu_blocks),
                block_size=int(self.block_size),
                hash_block_size=int(pool.hash_block_size),
                hash_fn=hash_fn,
                groups=groups,
                free_order=free_order_for(version) or "unknown",
                exact=not (problems or follower.problems),
                problems=problems + [p for p in follower.problems if p not in problems],
                digest_every=follower.digest_every,
                control_port=sender.control_port,
                started_at=started,
                seq=follower.seq,
                model=model,
                boot=boot,
                digest_scheme=SCHEME,
            )

        sender = Sender(
            endpoint,
            hello,
            follower.poll_snapshot,
            follower.stats,
            lambda: (follower.costs_kept, follower.cost_ns),
            cost_us=follower.cost_quantiles,
            digest=follower.latest_digest,
            reading=follower.reading,
            background=follower.catch_up,
            prepare=follower.prepare_encoded,
            turn=follower.passes.wait_turn if deferred else None,
            pace=follower.passes.pace if deferred else None,
            control_endpoint=control,
            key=key,
            max_queue=int(os.environ.get("BLOCKPOOL_MIRROR_QUEUE", "4096")),
        )
        self._mirror_sender = sender  # closed if what follows fails
        bound = sender.start()  # never raises; not bound: retried in the background
        self._mirror = follower
        if "://*:" in endpoint or "0.0.0.0" in endpoint:
            logger.warning(
                "blockpool mirror: %s listens on every network interface (block hashes and "
                "snapshots to anyone who connects); tcp://127.0.0.1:PORT keeps it local",
                endpoint,
            )
        logger.warning(
            "blockpool mirror: %s on %s (snapshots on %s), vLLM %s, %d blocks, %s; %s",
            "publishing" if bound else "NOT BOUND yet (retrying) to publish",
            endpoint,
            control,
            version,
            pool.num_gpu_blocks,
            "signed" if key is not None else "unsigned",
            "exact" if not problems else "NOT exact: " + "; ".join(problems),
        )

    # -------------------------------------------------------------- hooks

    def add_request(self, request: Any) -> None:
        m = self._mirror
        if m is not None:
            m.passes.ends()
        super().add_request(request)  # type: ignore[misc]
        if m is not None:
            t = time.perf_counter_ns() if m.timed else 0  # (0: not timed)
            hashes = _as_bytes(getattr(request, "block_hashes", ()))
            skips = getattr(request, "skip_reading_prefix_cache", None)
            if skips is None:  # vLLM 0.16: prompt_logprobs skips the lookup
                params = getattr(request, "sampling_params", None)
                skips = getattr(params, "prompt_logprobs", None) is not None
            m.request(
                Arrive(
                    str(request.request_id),
                    time.time(),
                    int(request.num_prompt_tokens),
                    hashes,
                    bool(skips),
                )
            )
            if t:
                m.step_ns += time.perf_counter_ns() - t

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        m = self._mirror
        if m is not None:
            m.passes.ends()
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        if m is not None:
            t = time.perf_counter_ns() if m.timed else 0  # (0: not timed)
            now = time.time()
            for new in out.scheduled_new_reqs:
                m.request(Scheduled(str(new.req_id), now, int(new.num_computed_tokens)))
            # preempted requests scheduled again (vLLM's resumed_req_ids, besides the new
            # ones but for the v2 model runner): running again, as the mirror counts them
            cached: Any = getattr(out, "scheduled_cached_reqs", None)
            resumed = getattr(cached, "resumed_req_ids", None)
            if resumed:
                for rid, done in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
                    if rid in resumed:
                        m.request(Scheduled(str(rid), now, int(done)))
            if t:
                m.step_ns += time.perf_counter_ns() - t
            m.flush()
            # the engine hands the step to its model now
            m.passes.begins(getattr(out, "total_num_scheduled_tokens", 0) or 0)
        return out

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        m = self._mirror
        if m is not None:
            m.passes.ends()
        out = super().update_from_output(*args, **kwargs)  # type: ignore[misc]
        if m is not None:
            m.flush()
        return out

    def finish_requests(self, *args: Any, **kwargs: Any) -> Any:
        m = self._mirror
        if m is not None:
            m.passes.ends()
        out = super().finish_requests(*args, **kwargs)  # type: ignore[misc]
        if m is not None:
            m.flush()
        return out

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> Any:
        m = self._mirror
        if m is not None:
            m.passes.ends()
        out = super().reset_prefix_cache(*args, **kwargs)  # type: ignore[misc]
        if m is not None:
            m.flush(force_digest=True)
        return out

    def shutdown(self) -> None:
        sender, self._mirror_sender = self._mirror_sender, None
        if sender is not None:
            try:
                sender.close()
            except Exception:
                logger.exception("blockpool mirror: closing the sender failed")
        super().shutdown()  # type: ignore[misc]


def _own_attribute(obj: Any, name: str) -> Any:
    """``obj``'s own (instance) attribute ``name``, ``_MISSING`` when it has
    none -- found without ``vars(obj)``: CPython (3.11) keeps an object's
    attributes in a dict once its ``__dict__`` is read, and every attribute
    of it is then loaded about twice as slowly (vLLM's pool and KV-cache
    manager, read on every step: 15 -> 32 ns a load, measured)."""
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        return _MISSING
    of_class = getattr(type(obj), name, _MISSING)
    if value is of_class or (
        getattr(value, "__func__", None) is of_class and getattr(value, "__self__", None) is obj
    ):
        return _MISSING  # the class's (a method: bound to obj)
    return value


def _as_bytes(hashes: Any) -> list[bytes]:
    """A request's block hashes as a list of bytes: copied in one call when
    they are bytes already (vLLM's ``BlockHash``), one by one otherwise."""
    if isinstance(hashes, list) and hashes and type(hashes[0]) is bytes:
        return hashes[:]  # (one type throughout: vLLM's hasher makes them all)
    return [bytes(h) for h in hashes]


class MirrorScheduler(_Mirrored, Scheduler):  # type: ignore[misc]
    """vLLM's synchronous Scheduler, followed."""


class MirrorAsyncScheduler(_Mirrored, AsyncScheduler):  # type: ignore[misc]
    """vLLM's AsyncScheduler (the default of current vLLM), followed."""
