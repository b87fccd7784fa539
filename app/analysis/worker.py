"""The analysis worker process: shadow pools, and live replicas of the pool.

Started with the ``spawn`` method (no fork of a threaded server).  One worker
serves every engine of the parent process over one pipe; messages are
tagged with the engine's channel id and each gets one reply (``cid``, ``n``
operations/accesses applied, ``error``):

    ("open", cid, specs, base_capacity, block_size, num_groups)  shadow pools
    ("batch", cid, accesses, real)                               -> stats
    ("restart", cid) / ("check", cid)

    ("ropen", cid, settings, keyframe)     a replica engine in that state
    ("rops", cid, [(times, blobs), ...])   recorded operations to apply
                                           -> stream section, Prometheus
                                              figures, new requests' reasons
    ("rquery", cid, qid, kind, args)       a view of the replica's analysis

    ("close", cid)
    None                                   exit
"""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Any

from blockpool.shadow import ShadowSet, ShadowSpec


class Replica:
    """A metadata-only engine fed the recorded operations, analysis inline."""

    def __init__(self, settings: dict[str, Any], keyframe: Any) -> None:
        from app.analysis.state import restore
        from app.engine import Engine
        from app.settings import Settings

        overrides = {
            "analysis": True,
            "analysis_mode": "inline",
            "recording": False,
            "storage": False,
            "demo": False,
            "kv_events_publisher": False,
            "memory_budget_bytes": None,
            "token": None,
        }
        if settings.get("shadow_mode") != "off":
            overrides["shadow_mode"] = "inline"
        self.engine = Engine(Settings(**{**settings, **overrides}))
        self.ts = keyframe.ts
        an = self.engine.analysis
        assert an is not None and an.local
        an.clock = self.now
        restore(self.engine, keyframe)
        an.rebase()

    def now(self) -> float:
        return self.ts

    def apply(self, parts: list[tuple[Any, list[bytes]]]) -> dict[str, Any]:
        from app.analysis import prom, views
        from app.analysis.recording import decode_op
        from app.errors import ApiError

        e = self.engine
        admitted: list[str] = []
        n = 0
        for times, blobs in parts:
            for ts, blob in zip(times, blobs, strict=True):
                self.ts = ts
                op, ok = decode_op(blob)
                n += 1
                try:
                    result = e.apply(op)
                except ApiError:
                    continue
                if ok and op.__class__.__name__ == "AdmitOp":
                    admitted.append(result["request_id"])
        e.tick()
        an = e.analysis
        assert an is not None
        reasons = {rid: views.pack_reasons(an, rid) for rid in admitted}
        return {
            "n": n,
            "stream": views.stream_section(an),
            "prom": prom.state(an),
            "reasons": {rid: r for rid, r in reasons.items() if r is not None},
        }

    def query(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        from app.analysis import views
        from app.errors import NotFound

        an = self.engine.analysis
        assert an is not None
        try:
            result: dict[str, Any] = getattr(views, kind)(an, **args)
        except NotFound as exc:
            return {"not_found": exc.message, "details": exc.details}
        return {"result": result}


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
        reply["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
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
