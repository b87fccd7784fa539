"""What the plugin says of itself in a GPU-scale run, and whether its digest
is vLLM's pool's: read from the scheduler ``bench.gpu_scale.engine`` built
(its follower and sender, as the plugin keeps them), for the report only."""

from __future__ import annotations

import json
import time
from typing import Any


def settled_digest(sched: Any, timeout_s: float = 60.0) -> dict[str, Any] | None:
    """Once the engine has stopped (after the measured steps): the plugin's
    digest, caught up by its thread while the engine idles, against vLLM's
    pool's own from scratch (O(pool), ``pool_digest``) -- whether what the
    plugin would prove a mirror equal with is vLLM's pool.  None without a
    plugin; ``caught_up`` False if its digest did not reach the last step in
    ``timeout_s``."""
    follower = getattr(sched, "_mirror", None)
    latest = getattr(follower, "latest_digest", None)
    if latest is None:
        return None
    from blockpool.mirror.digest import pool_digest

    deadline = time.monotonic() + timeout_s
    while (d := latest()) is None and time.monotonic() < deadline:
        time.sleep(0.01)  # (its thread reads once the engine is idle)
    if d is None:
        return {"caught_up": False}
    truth = pool_digest(sched.kv_cache_manager.block_pool)
    return {"caught_up": True, "ops": d.ops, "equal": d.value == truth}


def plugin_reported(sched: Any) -> dict[str, Any]:
    """Whatever the plugin says about itself, if it says anything: a
    ``mirror_stats()``-like method, or the follower's and sender's counters.
    Best effort, for the report only (nothing depends on it)."""
    got: dict[str, Any] = {}
    for name in ("mirror_stats", "mirror_histogram", "mirror_cost"):
        v = getattr(sched, name, None)
        if v is None:
            continue
        try:
            v = v() if callable(v) else v
            json.dumps(v)
            got[name] = v
        except Exception as e:  # a report only
            got[name] = f"unreadable: {e!r}"
    follower = getattr(sched, "_mirror", None)
    reader = getattr(follower, "reader", None)  # its digest read off the engine's thread
    for part, attrs in (
        (follower, ("cost_ns", "step", "seq", "op_count", "drops", "digest_every")),
        (follower, ("digests_on_engine",)),  # (a digest asked for: taken on its thread)
        (
            reader,
            (
                "digests_taken",
                "digests_discarded",
                "sweeps",
                "sweeps_finished",
                "windows_overrun",
                "readings_stopped",
                "read_ns_per_block",
                "sweep_ns_per_row",
                "named_ns_per_block",
            ),
        ),
    ):
        for attr in attrs:
            v = getattr(part, attr, None)
            if isinstance(v, int | float):
                got[f"follower.{attr}"] = v
    sweep = getattr(reader, "sweep", None)
    if sweep is not None:  # a digest being rebuilt in pieces (blockpool/mirror/digest_sweep.py)
        got["follower.sweep_rows_read"] = int(sweep.rows_read)
        got["follower.sweep_rows_left"] = int(sweep.left)
        got["follower.sweep_moments"] = int(sweep.moments)
        got["follower.sweep_pieces_discarded"] = int(sweep.pieces_discarded)
    reading = getattr(follower, "reading", None)
    if callable(reading):  # how far its digest is behind, as its handshake says it
        r = reading()
        if r is not None:
            got["follower.digest_behind_blocks"] = int(r.behind)
            got["follower.shortest_pass_us"] = r.window_us
    quantiles = getattr(follower, "cost_quantiles", None)
    if callable(quantiles):  # its own time on the engine's thread, the last steps (µs)
        got["follower.cost_us_p50_p99_max"] = quantiles()
    sender = getattr(sched, "_mirror_sender", None)
    for attr in ("sent", "bundles", "dropped", "snapshots"):
        v = getattr(sender, attr, None)
        if isinstance(v, int | float):
            got[f"sender.{attr}"] = v
    return got
