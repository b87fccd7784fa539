"""The analysis worker process: shadow pools, and live replicas of the pool.

Started with the ``spawn`` method (no fork of a threaded server).  One worker
serves every engine of the parent process over one pipe; messages are
tagged with the engine's channel id and each gets one reply (``cid``, ``n``
operations/accesses applied, ``error``):

    ("open", cid, specs, base_capacity, block_size, num_groups)  shadow pools
    ("batch", cid, accesses, real)                               -> stats
    ("restart", cid) / ("check", cid)

    ("ropen", cid, opening, keyframe)      a replica runtime in that state
    ("rops", cid, [(times, blobs), ...])   recorded operations to apply
                                           -> stream section, Prometheus
                                              figures, new requests' reasons
    ("rquery", cid, qid, kind, args)       a view of the replica's analysis
    ("rresync", cid, keyframe)             the engine's pool was put into
                                           another's state (a mirror's
                                           snapshot): the replica follows,
                                           its analysis kept and rebased

    ("close", cid)
    None                                   exit
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from blockpool.shadow import ShadowSet, ShadowSpec

logger = logging.getLogger("blockpool.analysis.worker")


class Replica:
    """A metadata-only runtime of the library fed the recorded operations,
    with the analysis (and the shadow pools) inline."""

    def __init__(self, opening: dict[str, Any], keyframe: Any) -> None:
        from blockpool.analysis.core import Analysis
        from blockpool.analysis.feeder import ShadowFeeder, ShadowLayout, shadow_specs
        from blockpool.runtime import PoolRuntime, RuntimeConfig
        from blockpool.runtime.state import restore

        config = RuntimeConfig(**opening["runtime"])
        self.rt = PoolRuntime(config)
        self.ts = keyframe.ts
        feeder = None
        shadows = opening.get("shadows")
        if shadows is not None and config.enable_caching:
            specs = shadow_specs(shadows["policies"], shadows["factors"], shadows["grid"])
            feeder = ShadowFeeder(
                ShadowLayout(specs, config.num_blocks - 1, config.block_size, config.num_groups)
            )
        self.analysis = Analysis(
            self.rt,
            miss_index_size=opening["miss_index_size"],
            miss_finished_kept=opening["miss_finished_kept"],
            feeder=feeder,
            clock=self.now,
        )
        self.rt.observe(self.analysis)
        restore(self.rt, keyframe)
        self.analysis.rebase()

    def now(self) -> float:
        return float(self.ts)

    def resync(self, keyframe: Any) -> None:
        """The engine's pool jumped to ``keyframe`` (no operation took it
        there): the replica's pool follows, and its analysis is told as the
        inline one is (``Analysis.on_resync``), so its counters go on."""
        from blockpool.runtime.state import restore

        self.ts = keyframe.ts
        restore(self.rt, keyframe)
        self.analysis.on_resync()

    def apply(self, parts: list[tuple[Any, list[bytes]]]) -> dict[str, Any]:
        from app.analysis import prom
        from blockpool.analysis import views
        from blockpool.analysis.segment import decode_op
        from blockpool.runtime.config import UNCAPPED
        from blockpool.runtime.errors import OperationError

        rt = self.rt
        admitted: list[str] = []
        n = 0
        for times, blobs in parts:
            for ts, blob in zip(times, blobs, strict=True):
                self.ts = ts
                op, ok = decode_op(blob)
                n += 1
                try:
                    result = rt.apply(op, UNCAPPED if ok else None)
                except OperationError:
                    continue
                if ok and op.__class__.__name__ == "AdmitOp":
                    admitted.append(result["request_id"])
        an = self.analysis
        an.on_tick()
        reasons = {rid: views.pack_reasons(an, rid) for rid in admitted}
        return {
            "n": n,
            "stream": views.stream_section(an),
            "prom": prom.state(an),
            "reasons": {rid: r for rid, r in reasons.items() if r is not None},
        }

    def query(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        from blockpool.analysis import views
        from blockpool.runtime.errors import NotFound

        if kind == "pool":
            return {"result": pool_view(self.rt)}
        try:
            result: dict[str, Any] = views.VIEWS[kind](self.analysis, **args)
        except NotFound as exc:
            return {"not_found": exc.message, "details": exc.details}
        return {"result": result}


def pool_view(rt: Any) -> dict[str, Any]:
    """The analysed pool itself, its invariants checked: the mirror's digest
    of it (blockpool/mirror) proves a worker's replica is the engine's pool."""
    from blockpool.mirror.digest import pool_digest

    rt.check()
    return {"digest": pool_digest(rt.pool), "free_blocks": rt.pool.get_num_free_blocks()}


def handle(state: dict[int, Any], msg: tuple[Any, ...]) -> dict[str, Any]:
    kind, cid = msg[0], msg[1]
    reply: dict[str, Any] = {"cid": cid, "n": 0, "error": None, "real": None}
    try:
        if kind == "close":
            state.pop(cid, None)
            return reply
        if kind == "ropen":
            state[cid] = Replica(msg[2], msg[3])
            return reply
        if kind == "rops":
            reply.update(state[cid].apply(msg[2]))
            return reply
        if kind == "rresync":
            state[cid].resync(msg[2])
            return reply
        if kind == "rquery":
            reply["qid"] = msg[2]
            reply.update(state[cid].query(msg[3], msg[4]))
            return reply
        if kind == "open":
            _, _, specs, base, bs, groups = msg
            state[cid] = ShadowSet([ShadowSpec(p, f) for p, f in specs], base, bs, groups)
        else:
            shadows = state[cid]
            if kind == "batch":
                shadows.apply(msg[2])
                reply["n"] = len(msg[2])
                reply["real"] = msg[3]
            elif kind == "restart":
                shadows.restart()
            elif kind == "check":
                for pool in shadows.pools:
                    pool.check()
        shadows = state[cid]
        reply["stats"] = shadows.stats()
        reply["accesses"] = shadows.accesses
    except Exception as exc:  # report, keep serving the other channels
        # the traceback goes to the worker's log; the reply says what failed
        logger.exception("analysis worker: %s on channel %s failed", kind, cid)
        reply["error"] = f"{type(exc).__name__}: {exc}"
        if kind == "rops":
            reply["n"] = sum(len(b) for _, b in msg[2])
    return reply


def main(conn: Any) -> None:
    # Observers never slow the pool: on a busy machine the engine's process
    # gets the CPU first (the analysis lags, and resyncs if it falls too far).
    with contextlib.suppress(OSError, AttributeError):
        os.nice(10)
    state: dict[int, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        try:
            conn.send(handle(state, msg))
        except (BrokenPipeError, OSError):
            return
