"""Keyframes: a runtime's whole state at one moment, and back.

A keyframe holds what the next operations depend on -- every block's ref
count and hash, the free queue's order, the hash map (keys in order, one
block or a dict of copies in insertion order), the running requests (tokens,
hashes, block tables, extra keys), the manager's finished ids and prefix-cache
stats, the runtime's counters, raw references and request-id counter, the
metrics collector's random state and sampled blocks -- so that restoring it
into a fresh runtime and applying the same operations gives the same block
ids, queue order, map and events.  Token and hash lists are referenced with
their length then (they only ever grow), not copied.

Not kept: the K/V tensors (metadata only), the sampled blocks' timestamps
(restored as fresh), the prefix tree and the logs (they follow from events).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from blockpool.core.snapshot import (
    PoolSnapshot,
    capture_pool,
    pool_digest,
    restore_pool,
    snapshot_from_json,
    snapshot_to_json,
)
from blockpool.runtime.counters import Counters

if TYPE_CHECKING:
    from blockpool.runtime.runtime import PoolRuntime

# random.Random's state: (version, the Mersenne Twister's words, the next gauss)
RngState = tuple[int, tuple[int, ...], float | None]


@dataclass
class RuntimeKeyframe:
    """The pool's snapshot plus the runtime's own state (see the module doc)."""

    seq: int
    ts: float
    pool: PoolSnapshot
    counters: dict[str, Any]
    raw_refs: list[tuple[int, int]]
    next_request: int
    rng_state: RngState | None
    tail_waste: int


def snapshot(rt: PoolRuntime, seq: int, ts: float) -> RuntimeKeyframe:
    """The runtime's state now (O(blocks + running requests))."""
    raw = rt.raw_refs
    nz = np.flatnonzero(raw)
    return RuntimeKeyframe(
        seq=seq,
        ts=ts,
        pool=capture_pool(rt.pool, rt.manager),
        counters=dataclasses.asdict(rt.counters),
        raw_refs=list(zip(nz.tolist(), raw[nz].tolist(), strict=True)),
        next_request=rt.request_counter,
        rng_state=rt.rng.getstate() if rt.rng is not None else None,
        tail_waste=rt.tail_waste,
    )


def restore(rt: PoolRuntime, kf: RuntimeKeyframe, *, check: bool = True) -> None:
    """Put a fresh runtime (same config) into the keyframe's state
    (``check``: the pool's invariants after it)."""
    if rt.pool.num_gpu_blocks != kf.pool.num_blocks:
        raise ValueError(
            f"keyframe of {kf.pool.num_blocks} blocks, runtime of {rt.pool.num_gpu_blocks}"
        )
    restore_pool(kf.pool, rt.pool, rt.manager, check=check)
    rt._journal = None  # a spare of this runtime's (trial.py) is out of step now
    counters = dict(kf.counters)
    counters["events"] = dict(counters["events"])
    rt.counters = Counters(**counters)
    rt.raw_refs[:] = 0
    for bid, n in kf.raw_refs:
        rt.raw_refs[bid] = n
    rt.request_counter = kf.next_request
    if rt.rng is not None and kf.rng_state is not None:
        rt.rng.setstate(kf.rng_state)
    rt.tail_waste = kf.tail_waste
    rt.tree.clear()
    rt.mark_all_dirty()
    rt.columns.take_dirty()


def digest(rt: PoolRuntime) -> dict[str, Any]:
    """Everything observable that replay must reproduce (tests, verification)."""
    out = pool_digest(rt.pool, rt.manager)
    out["raw_refs"] = tuple(rt.raw_refs.tolist())
    # (not ``ops``: it also counts closures run on the runtime, e.g. a batch)
    out["counters"] = repr({k: v for k, v in dataclasses.asdict(rt.counters).items() if k != "ops"})
    out["next_request"] = rt.request_counter
    return out


# ------------------------------------------------------------------- JSON


def keyframe_json(kf: RuntimeKeyframe) -> dict[str, Any]:
    return {
        "seq": kf.seq,
        "ts": kf.ts,
        **snapshot_to_json(kf.pool),
        "counters": kf.counters,
        "raw_refs": [list(p) for p in kf.raw_refs],
        "next_request": kf.next_request,
        "rng_state": _rng_json(kf.rng_state),
        "tail_waste": kf.tail_waste,
    }


def keyframe_from_json(d: dict[str, Any]) -> RuntimeKeyframe:
    return RuntimeKeyframe(
        seq=int(d["seq"]),
        ts=float(d["ts"]),
        pool=snapshot_from_json(d),
        counters=dict(d["counters"]),
        raw_refs=[(int(a), int(b)) for a, b in d["raw_refs"]],
        next_request=int(d["next_request"]),
        rng_state=_rng_from_json(d["rng_state"]),
        tail_waste=int(d.get("tail_waste", 0)),
    )


def _rng_json(state: RngState | None) -> list[object] | None:
    if state is None:
        return None
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_from_json(d: list[object] | None) -> RngState | None:
    if d is None:
        return None
    return cast(RngState, (d[0], tuple(cast(list[int], d[1])), d[2]))
