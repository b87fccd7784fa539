"""The mirror's subscriber: one asyncio task that keeps the engine's runtime
equal to a real engine's pool.

It reads the plugin's PUB stream (blockpool/mirror/protocol.py), asks the
control socket for a snapshot at start and after any gap or divergence,
and hands each batch to the service's one writer (``Engine.submit``), where
``MirrorApplier`` applies and checks it.  A message it cannot read is
counted and skipped; nothing a stranger sends ends the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

import zmq
import zmq.asyncio

from app.core.errors import NotFound
from app.mirror.requests import RequestBook
from app.mirror.status import MirrorStatus
from app.mirror.story import engine_story
from blockpool.analysis.engine_misses import EngineMisses
from blockpool.mirror import protocol as wire
from blockpool.mirror.apply import Divergence, Gap, MirrorApplier

logger = logging.getLogger("blockpool.mirror")

SNAPSHOT_TIMEOUT_S = 30.0
RETRY_S = 1.0


class MirrorClient:
    def __init__(self, engine: Any, endpoint: str, control_endpoint: str) -> None:
        self.engine = engine
        self.endpoint = endpoint
        self.control_endpoint = control_endpoint
        self.status = MirrorStatus(endpoint, control_endpoint)
        self.book = RequestBook()
        self.applier = MirrorApplier(engine.runtime)
        host = engine.analysis  # its eviction memory where it is inline, else one of its own
        self.misses = EngineMisses.observing(engine.runtime, host.inline if host else None)
        if host is not None:  # the dashboard's miss reasons are the engine's requests'
            host.show_engine_misses(self.misses)
        self._task: asyncio.Task[None] | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._unsupported = False

    def story(self, rid: str) -> dict[str, Any]:
        """The engine's request ``rid`` as a request story (NotFound: never heard of)."""
        r = self.book.requests.get(rid)
        if r is None:
            raise NotFound(
                f"the engine's plugin told of no request {rid!r} (the mirror keeps the last "
                f"{self.book.capacity} requests it heard of)",
                request_id=rid,
            )
        return engine_story(self.engine, self.book, r)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._task = asyncio.create_task(self._run(), name="mirror-subscriber")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    # ----------------------------------------------------------------- loop

    async def _run(self) -> None:
        assert self._ctx is not None
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)  # batches wait in ZMQ while a snapshot comes
        sub.setsockopt(zmq.MAXMSGSIZE, 64 * 1024 * 1024)
        sub.setsockopt(zmq.SUBSCRIBE, wire.TOPIC)
        sub.connect(self.endpoint)
        try:
            while True:
                if not self.applier.synced and self.status.hello is not None:
                    await self._resync()
                if not await sub.poll(500):
                    continue
                frames = await sub.recv_multipart()
                try:
                    await self._handle(frames)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug: counted and logged, the task goes on
                    self.status.bad_messages += 1
                    logger.exception("mirror: a message could not be applied")
        finally:
            sub.close(0)

    async def _handle(self, frames: list[bytes]) -> None:
        st = self.status
        if len(frames) != 3 or frames[0] != wire.TOPIC:
            st.bad_messages += 1
            return
        try:
            msg = wire.decode(frames[1])
        except wire.ProtocolError as exc:
            st.bad_messages += 1
            st.problem(str(exc))
            return
        st.seen()
        if isinstance(msg, wire.Hello):
            self._hello(msg)
        elif isinstance(msg, wire.Batch):
            await self._batch(msg)
        elif isinstance(msg, wire.Beat):
            self._beat(msg)
        else:
            st.bad_messages += 1

    def _hello(self, hello: wire.Hello) -> None:
        st = self.status
        first = st.hello is None
        if not first and st.hello is not None and hello.started_at != st.hello.started_at:
            logger.warning("mirror: the engine restarted; resyncing")
            self.applier.synced = False
            st.synced = False
        st.hello = hello
        n = self.engine.pool.num_gpu_blocks
        if hello.num_gpu_blocks != n:
            st.problem(f"the engine has {hello.num_gpu_blocks} blocks, the mirror {n}")
            self._unsupported = True
        if not hello.exact:
            self._unsupported = True
        if first:
            logger.info(
                "mirror: engine %s (vLLM %s, %d blocks, %s)%s",
                hello.engine_id,
                hello.vllm_version,
                hello.num_gpu_blocks,
                hello.free_order,
                "" if hello.exact else " NOT exact: " + "; ".join(hello.problems),
            )

    def _beat(self, beat: wire.Beat) -> None:
        st = self.status
        st.engine_drops = beat.drops
        st.engine_steps, st.engine_cost_ns = beat.steps, beat.cost_ns
        if self.applier.synced and beat.ops > self.applier.next_op:
            self._lost(f"the engine is at operation {beat.ops}, the mirror {self.applier.next_op}")

    def _lost(self, why: str) -> None:
        st = self.status
        st.gaps += 1
        st.problem(why)
        st.exact = False
        self.applier.synced = False
        st.synced = False

    async def _batch(self, batch: wire.Batch) -> None:
        st = self.status
        st.engine_drops = batch.drops
        first = self.book.apply(batch.requests, batch.seq)
        if not self.applier.synced:  # the requests' hash chains: a resync's tree needs them
            await self.engine.submit(lambda: self.applier.learn_requests(batch.requests))
            return  # the snapshot asked for covers it (or a later batch does)
        # a batch that never came: its operations are a Gap (below); one with
        # request records only is a gap too, though the pool needs no resync
        jumped = bool(st.last_seq) and batch.seq > st.last_seq + 1
        st.last_seq = max(st.last_seq, batch.seq)
        try:
            applied = await self.engine.submit(lambda: self._apply(batch, first))
            if jumped:
                st.gaps += 1
        except Divergence as exc:
            if isinstance(exc, Gap):
                self._lost(str(exc))
            else:
                st.divergences += 1
                st.problem(str(exc))
                st.exact = False
                self.applier.synced = False
                st.synced = False
            logger.warning("mirror: %s; resyncing", exc)
            return
        st.batches += 1
        st.ops_applied += applied.ops
        if applied.digest_checked:
            st.digests_checked += 1
            st.exact = not self._unsupported
        st.lags_ms.append(max(0.0, (time.time() - batch.ts) * 1000.0))

    def _apply(self, batch: wire.Batch, first: list[str]) -> Any:
        """The writer: the requests first scheduled in this step are
        classified against the pool as the step found it, then its
        operations are applied."""
        book = self.book
        now = time.time()
        self.applier.learn_requests(batch.requests)  # parents for a resync's tree
        for rid in first:
            r = book.requests.get(rid)
            raw = book.raw.pop(rid, None)
            prompt, hit = (r["prompt_tokens"], r["hit_tokens"]) if r else (None, None)
            if raw is None or not isinstance(prompt, int) or not isinstance(hit, int):
                continue
            if prompt <= 0:
                continue
            assert r is not None
            r["reasons"], r["miss_details"] = self.misses.classify(
                raw, prompt, hit, now, skips_cache=bool(r["skips_cache"])
            )
        applied = self.applier.apply_batch(batch)
        # the next tick's frames carry it (the stream's ``mirror`` header)
        self.status.applied_batch, self.status.applied_ts = batch.seq, batch.ts
        return applied

    def _restore(self, snap: wire.Snapshot) -> None:
        """The writer: the runtime into the snapshot's state (its observers,
        the analysis, are told by the runtime: ``PoolRuntime.restore``)."""
        self.applier.restore(snap)

    async def _resync(self) -> None:
        """Ask for a snapshot and put the runtime into its state."""
        st = self.status
        assert self._ctx is not None
        req = self._ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.setsockopt(zmq.MAXMSGSIZE, 256 * 1024 * 1024)
        req.connect(self.control_endpoint)
        try:
            request = wire.SnapshotRequest(reason="resync", ts=time.time(), nonce=os.urandom(16))
            await req.send_multipart([wire.encode(request), b""])
            if not await req.poll(int(SNAPSHOT_TIMEOUT_S * 1000)):
                raise TimeoutError(f"no snapshot from {self.control_endpoint}")
            frames = await req.recv_multipart()
            msg = wire.decode(frames[0]) if len(frames) == 2 and frames[0] else None
            if not isinstance(msg, wire.Snapshot):
                raise wire.ProtocolError("the engine sent no snapshot")
            await self.engine.submit(lambda: self._restore(msg))
        except (TimeoutError, wire.ProtocolError, Divergence) as exc:
            st.resync_failures += 1
            st.problem(f"resync failed: {exc}")
            logger.warning("mirror: resync failed: %s", exc)
            await asyncio.sleep(RETRY_S)
            return
        finally:
            req.close(0)
        st.resyncs += 1
        st.synced = True
        st.last_seq = msg.seq
        st.exact = not self._unsupported and not msg.problems
        self.applier.set_stats(msg.stats)
        logger.info("mirror: in step with the engine at operation %d", msg.ops)
