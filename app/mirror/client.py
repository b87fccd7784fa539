"""The mirror's subscriber: keeps the engine's runtime equal to a real engine's pool.

Two asyncio tasks.  The reader takes the plugin's PUB frames off ZMQ as
they come (on the event loop: cheap) into a bounded inbox (app/mirror/inbox.py).
The processor takes every message waiting as one group, verifies and decodes
it (in a worker thread of its own when the group is large, so the service
answers while a 5 MB message is read), and hands the group's batches to the
service's one writer (``Engine.submit``) as one call, where
``MirrorApplier`` applies and checks each (gap, divergence, digest).

Trust: with the shared secret (``StreamKey``) a message whose mac does not
verify is dropped before a byte of it is decoded, and counted; a snapshot
reply must be signed over the request's nonce.  Without it, anything on the
endpoint is taken (and a signed message is taken unverified).

Engine identity: every message carries the ``boot`` of the plugin's run.
A new boot is an engine restarted: one resync from a snapshot; whatever an
earlier run left queued is dropped unread (counted).  An engine restarted
as another pool (blocks, block size, hash, free order) cannot be followed by
this service's pool: no snapshot is asked of it; the client hands the new
run's handshake (verified, where keyed) to ``rebuild`` (app/mirror/rebuild.py),
and ``serve`` rebuilds the whole service from it (app/cli/commands.py).  Without
``rebuild`` (or when the handshake is of the shape the service was built
from, one it cannot be built as) the status says to restart the mirror.

One place asks for snapshots (``_resync``, over app/mirror/snapshot_request.py):
at start, after a gap, a divergence, a restart, or a backlog dropped because
it grew past its bound.
A message the processor cannot read is counted and skipped; nothing a
stranger sends ends the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from app.mirror.engine_reports import EngineReports
from app.mirror.engine_runs import EngineRuns
from app.mirror.inbox import MAX_BACKLOG, MirrorInbox, Opened
from app.mirror.queues import EngineQueues
from app.mirror.rebuild import ServiceRebuild
from app.mirror.request_book import RequestBook
from app.mirror.snapshot_request import ask_snapshot
from app.mirror.status import MirrorStatus
from app.mirror.story import story_of
from app.shared.errors import NotFound
from blockpool.analysis.engine_misses import EngineMisses
from blockpool.common.backoff import Backoff
from blockpool.mirror import protocol as wire
from blockpool.mirror.apply import Applied, Divergence, Gap, MirrorApplier
from blockpool.mirror.auth import StreamKey
from blockpool.mirror.shadow_feed import MirrorShadowFeed
from blockpool.mirror.traffic import TrafficLog

if TYPE_CHECKING:  # (the engine builds its mirror: no import at run time)
    from app.pool.engine import Engine

logger = logging.getLogger("blockpool.mirror")

RETRY_S = 1.0  # the first wait after a failed resync, doubled up to RETRY_MAX_S
CHAINS_KEPT = 20_000  # request records kept for the next resync's prefix tree
RETRY_MAX_S = 30.0


class MirrorClient:
    def __init__(
        self,
        engine: Engine,
        endpoint: str,
        control_endpoint: str,
        key: StreamKey | None = None,
        hello: wire.Hello | None = None,
        max_lag_s: float = 2.0,
        max_backlog: int = MAX_BACKLOG,
        rebuild: Callable[[wire.Hello], None] | None = None,
        rebuilds: int = 0,
    ) -> None:
        self.engine = engine
        self.endpoint = endpoint
        self.control_endpoint = control_endpoint
        self.key = key
        self.status = MirrorStatus(
            endpoint, control_endpoint, key is not None, max_lag_s, rebuilds=rebuilds
        )
        # frames received, not yet handled (a backlog past its bound: a resync)
        self.inbox = MirrorInbox(self.status, key, max_backlog, self._unsync)
        self.reports = EngineReports(self.status)  # the handshake's and beats' figures
        self.status.backlog = self.inbox.backlog
        self.book = RequestBook()
        # the engine's requests as a trace (GET /api/mirror/trace, the export)
        self.traffic = TrafficLog()
        self.what_if: MirrorShadowFeed | None = None  # (feed_shadows)
        self.queues = EngineQueues()  # the engine's running and waiting requests
        self.applier = MirrorApplier(engine.runtime)
        self._beat_digest: wire.Digest | None = None  # the last beat's, checked
        host = engine.analysis  # its eviction memory where it is inline, else one of its own
        self.misses = EngineMisses.observing(engine.runtime, host.inline if host else None)
        if host is not None:  # the dashboard's miss reasons are the engine's requests'
            host.show_engine_misses(self.misses)
        self._task: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._decoder: ThreadPoolExecutor | None = None
        self.runs = EngineRuns()  # the engine's run followed, and the earlier ones
        self._retry_at = 0.0  # monotonic: no resync before (backoff)
        self._chains: list[wire.Record] = []  # request records heard while out of step
        self._retry = Backoff(RETRY_S, RETRY_MAX_S)
        # a new pool: the service rebuilt from the engine's new handshake
        self.service_rebuild = ServiceRebuild(rebuild, hello)
        if hello is not None:
            self._hello(hello)

    @property
    def boot(self) -> str | None:
        """The engine run followed (None: none heard yet)."""
        return self.runs.boot

    def feed_shadows(self, feed: MirrorShadowFeed) -> None:
        """What-if on the mirror: ``feed`` hears every batch's request records."""
        self.what_if = feed

    def story(self, rid: str) -> dict[str, Any]:
        """The engine's request ``rid`` as a request story, by vLLM's id or the
        client's (NotFound: never heard of)."""
        told = story_of(self.engine, self.book, rid)
        if told is None:
            raise NotFound(
                f"the engine's plugin told of no request {rid!r}, by vLLM's id or the client's "
                f"(the mirror keeps the last "
                f"{self.book.capacity} requests it heard of)",
                request_id=rid,
            )
        return told

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="mirror-decode")
        self.inbox.arrived = asyncio.Event()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.inbox.max_backlog)
        sub.setsockopt(zmq.MAXMSGSIZE, wire.MAX_BATCH_BYTES)
        sub.setsockopt(zmq.SUBSCRIBE, wire.TOPIC)
        sub.connect(self.endpoint)
        self._reader = asyncio.create_task(self.inbox.read(sub), name="mirror-reader")
        self._task = asyncio.create_task(self._run(), name="mirror-subscriber")

    async def stop(self) -> None:
        for task in (self._task, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._reader = None
        if self._decoder is not None:
            self._decoder.shutdown(wait=False, cancel_futures=True)
            self._decoder = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    # ------------------------------------------------------------ processor

    async def _run(self) -> None:
        st = self.status
        inbox = self.inbox
        while True:
            if self._resync_due():
                await self._resync()
                continue
            if not inbox.frames:
                await inbox.wait(0.5)
                continue
            frames, size = inbox.take()
            try:
                opened = await inbox.open_all(frames, size, self._decoder)
                await self._handle_group(opened)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug: counted and logged, the task goes on
                st.bad_messages += 1
                logger.exception("mirror: a message could not be applied")
            finally:
                inbox.done()

    async def _handle_group(self, opened: list[Opened]) -> None:
        st = self.status
        batches: list[tuple[wire.Batch, list[str]]] = []
        for msg, signed in opened:
            if msg is None:
                st.refused()
                continue
            if isinstance(msg, str):
                st.bad_messages += 1
                st.problem(msg)
                continue
            if not self._admit(msg):
                continue
            st.seen()
            st.messages += 1
            if signed and self.key is None:
                st.signed_unverified += 1
            if carried := wire.batches_of(msg):
                for batch in carried:
                    taken = self._take(batch)
                    if taken is not None:
                        batches.append(taken)
                continue
            if batches:  # what came before it first
                await self._apply_group(batches)
                batches = []
            if isinstance(msg, wire.Hello):
                self.queues.heard(msg.seq, time.time())
                self._hello(msg)
            elif isinstance(msg, wire.Beat):
                self.queues.heard(msg.seq, msg.ts)
                self._beat(msg)
                d = msg.digest
                if d is not None and self.applier.synced and d != self._beat_digest:
                    await self._check_beat_digest(d)
            else:
                st.bad_messages += 1
        if batches:
            await self._apply_group(batches)

    def _admit(self, msg: wire.Message) -> bool:
        """Whether ``msg`` is of the engine run followed (a new run: a restart)."""
        boot = getattr(msg, "boot", "")
        runs = self.runs
        if runs.boot is None or boot == runs.boot:
            runs.follow(boot)
            return True
        st = self.status
        if runs.is_earlier(boot):
            st.stale_discarded += len(wire.batches_of(msg)) or 1
            return False
        runs.follow(boot)
        st.engine_restarts += 1
        self.queues.restart()  # the new run holds no request of the old one's
        st.problem("the engine restarted (a new boot): resyncing from a snapshot")
        logger.warning("mirror: the engine restarted; resyncing")
        self._unsync()
        return True

    # --------------------------------------------------------------- messages

    def _hello(self, hello: wire.Hello) -> None:
        st = self.status
        first = self.reports.heard_hello(hello)
        if self.runs.boot is None:
            self.runs.follow(hello.boot)
        pool, s = self.engine.pool, self.engine.settings
        mine = (pool.num_gpu_blocks, s.block_size, s.hash_fn, s.free_order)
        st.shape_problem = self.service_rebuild.mismatch(hello, mine)
        if st.shape_problem is not None:
            st.problem(st.shape_problem)
            self._unsync()
            self._ask_rebuild(hello)
        self.reports.hello_said(hello, first)

    def _ask_rebuild(self, hello: wire.Hello) -> None:
        """Hand the engine's new handshake to ``rebuild`` (the message was
        taken: verified where keyed, of the engine run followed now)."""
        if hello.boot == self.boot:
            self.service_rebuild.ask(hello, self.status)

    def _beat(self, beat: wire.Beat) -> None:
        self.reports.heard_beat(beat)
        if self.what_if is not None:  # idle: the what-if may start from its counters
            self.what_if.begin(beat.stats)
        if self.applier.synced and beat.ops > self.applier.next_op:
            self._lost(f"the engine is at operation {beat.ops}, the mirror {self.applier.next_op}")

    async def _check_beat_digest(self, d: wire.Digest) -> None:
        """An idle engine's digest (a busy one's ride on its batches), checked
        by the writer against the mirror's own at the same boundary."""
        st = self.status
        try:
            checked = await self.engine.submit(lambda: self.applier.check_digest(d))
        except Divergence as exc:
            st.divergences += 1
            st.problem(str(exc))
            self._unsync()
            logger.warning("mirror: %s; resyncing", exc)
            return
        if checked:
            self._beat_digest = d  # the same one, beat after beat, is checked once
            st.digest_matched()

    def _unsync(self) -> None:
        """The runtime is no longer the engine's: the next turn asks for a snapshot."""
        self.applier.synced = False
        self._beat_digest = None
        self.status.lost()

    def _lost(self, why: str) -> None:
        st = self.status
        st.gaps += 1
        st.problem(why)
        self._unsync()

    def _take(self, batch: wire.Batch) -> tuple[wire.Batch, list[str]] | None:
        """A batch's request records (always); the batch itself when it is to be applied."""
        st = self.status
        st.engine_drops = batch.drops
        first = self.book.apply(batch.requests, batch.seq)
        self.traffic.apply(batch.requests)
        if self.what_if is not None:
            self.what_if.apply(batch.requests, batch.stats, batch.seq)
        self.queues.batch(batch.seq, batch.ts, batch.requests)
        if not self.applier.synced:
            # the requests' hash chains: a resync's prefix tree needs them (learnt
            # by the writer, before the restore); the snapshot covers the rest
            self._chains.extend(batch.requests)
            del self._chains[: max(0, len(self._chains) - CHAINS_KEPT)]
            return None
        return batch, first

    async def _apply_group(self, batches: list[tuple[wire.Batch, list[str]]]) -> None:
        """The group's batches in one writer call, each checked as it applies."""
        st = self.status
        done: list[tuple[wire.Batch, Applied]] = []

        def write() -> None:
            for batch, first in batches:
                if not self.applier.synced:
                    return  # an earlier batch of the group diverged
                done.append((batch, self._apply(batch, first)))

        st.writer_calls += 1
        failed: Divergence | None = None
        try:
            await self.engine.submit(write)
        except Divergence as exc:
            failed = exc
        now = time.time()
        for batch, applied in done:
            # a batch that never came: its operations are a Gap (below); one
            # with request records only is a gap too, though the pool needs no resync
            if st.last_seq and batch.seq > st.last_seq + 1:
                st.gaps += 1
            st.last_seq = max(st.last_seq, batch.seq)
            st.batches += 1
            st.ops_applied += applied.ops
            if applied.digest_checked:
                st.digest_matched()
            st.lags_ms.append(max(0.0, (now - batch.ts) * 1000.0))
        if failed is not None:
            if isinstance(failed, Gap):
                self._lost(str(failed))
            else:
                st.divergences += 1
                st.problem(str(failed))
                self._unsync()
            logger.warning("mirror: %s; resyncing", failed)

    def _apply(self, batch: wire.Batch, first: list[str]) -> Applied:
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
        chains, self._chains = self._chains, []
        self.applier.learn_requests(chains)
        self.applier.restore(snap)

    # ---------------------------------------------------------------- resync

    def _resync_due(self) -> bool:
        st = self.status
        return (
            not self.applier.synced
            and st.hello is not None
            and st.hello.boot == self.boot  # a restarted engine: its handshake first
            and st.shape_problem is None
            and time.monotonic() >= self._retry_at
        )

    async def _resync(self) -> None:
        """Ask for a snapshot and put the runtime into its state (the one place)."""
        st = self.status
        try:
            assert self._ctx is not None
            snap = await ask_snapshot(self._ctx, self.control_endpoint, self.key, st, self._decoder)
            if snap.num_blocks != self.engine.pool.num_gpu_blocks:
                # its handshake (a rebuild) is awaited: the next one clears it or rebuilds
                st.shape_problem = (
                    f"the engine restarted with {snap.num_blocks} blocks; the mirror follows "
                    f"{self.engine.pool.num_gpu_blocks}: waiting for its handshake"
                )
                raise Divergence(st.shape_problem)
            if self.runs.is_earlier(snap.boot):
                raise wire.ProtocolError("a snapshot of an earlier run of the engine")
            await self.engine.submit(lambda: self._restore(snap))
        except (TimeoutError, wire.ProtocolError, Divergence) as exc:
            st.resync_failures += 1
            st.problem(f"resync failed: {exc}")
            logger.warning("mirror: resync failed: %s", exc)
            self._retry_at = time.monotonic() + self._retry.failed()
            return
        self._retry.reset()
        if self.runs.follow(snap.boot):  # the engine restarted meanwhile: this is the new run
            st.engine_restarts += 1
            self.queues.restart()
        st.resynced(snap.seq)
        st.seen()  # the engine answered (signed, where keyed)
        if snap.problems:
            st.unsupported = True
        self.applier.set_stats(snap.stats)
        logger.info("mirror: in step with the engine at operation %d", snap.ops)
