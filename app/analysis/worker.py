"""The shadow worker process: shadow pools off the engine's core.

Started with the ``spawn`` method (no fork of a threaded server), it imports
only the library's ``blockpool.shadow``.  One worker serves every engine of
the parent process over one pipe; messages are tagged with the engine's
channel id:

    ("open", cid, specs, base_capacity, block_size, num_groups)
    ("batch", cid, accesses, real)    real: the engine's (queries, hits) then
    ("restart", cid)                  every shadow of cid empty again
    ("check", cid)                    audit every shadow (tests)
    ("close", cid)
    None                              exit

Each message gets one reply: {"cid", "n" (accesses applied), "stats",
"accesses", "real", "error"}.
"""

from __future__ import annotations

import traceback
from typing import Any

from blockpool.shadow import ShadowSet, ShadowSpec


def handle(sets: dict[int, ShadowSet], msg: tuple[Any, ...]) -> dict[str, Any]:
    kind, cid = msg[0], msg[1]
    reply: dict[str, Any] = {"cid": cid, "n": 0, "error": None, "real": None}
    try:
        if kind == "open":
            _, _, specs, base, bs, groups = msg
            sets[cid] = ShadowSet([ShadowSpec(p, f) for p, f in specs], base, bs, groups)
        elif kind == "close":
            sets.pop(cid, None)
            return reply
        else:
            shadows = sets[cid]
            if kind == "batch":
                shadows.apply(msg[2])
                reply["n"] = len(msg[2])
                reply["real"] = msg[3]
            elif kind == "restart":
                shadows.restart()
            elif kind == "check":
                for pool in shadows.pools:
                    pool.check()
        shadows = sets[cid]
        reply["stats"] = shadows.stats()
        reply["accesses"] = shadows.accesses
    except Exception as exc:  # report, keep serving the other channels
        reply["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
    return reply


def main(conn: Any) -> None:
    sets: dict[int, ShadowSet] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        try:
            conn.send(handle(sets, msg))
        except (BrokenPipeError, OSError):
            return
