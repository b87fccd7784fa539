"""One entry point: replay a trace in a mode at many capacities.

Sequence mode uses the one-pass curve (``curve.py``) under either free
order; everywhere else -- timed mode, or when asked to -- each capacity gets
its own real pool.  The default free order is the newest vLLM's
(``uncached_first``, vLLM >= 0.24); vLLM 0.16's ``append_all`` is one
argument away, and every report says which it replayed.  So does a layout of
other KV-cache groups than one full-attention group (``groups``: a sliding
window, a hybrid model), in sequence mode only: there the blocks a request
holds depend on its hit, which the one-pass curve cannot follow.
"""

from __future__ import annotations

import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from blockpool.core.attention import GroupSpec
from blockpool.core.free_order import APPEND_ALL, FREE_ORDERS, UNCACHED_FIRST, FreeOrder
from blockpool.core.hashing import get_hash_fn_by_name
from blockpool.trace.replay.curve import OnePassCurve
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.replay.sequence import SequencePools, make_pool
from blockpool.trace.replay.sequence_groups import describe_groups, is_plain
from blockpool.trace.sched.timed import TimedConfig, replay_timed
from blockpool.trace.workload.reader import Trace

Mode = Literal["sequence", "timed"]
MODES: tuple[str, ...] = typing.get_args(Mode)
# The free order a replay takes unless told: the newest vLLM's.
DEFAULT_FREE_ORDER: FreeOrder = UNCACHED_FIRST
# Which vLLM frees each way (what every report prints beside the order's name).
FREE_ORDER_VLLM: dict[str, str] = {APPEND_ALL: "vLLM 0.16", UNCACHED_FIRST: "vLLM >= 0.24"}


def free_order_label(free_order: str) -> str:
    """``"uncached_first (vLLM >= 0.24)"``."""
    return f"{free_order} ({FREE_ORDER_VLLM.get(free_order, 'not a vLLM order')})"


ONE_PASS_NOTE = "one pass: exact for every capacity (sequence mode, free order {free_order})"
NO_ONE_PASS = {
    "timed": "no one pass in timed mode (blocks are held across requests): one replay per capacity",
    "asked": "one replay per capacity (as asked)",
    "groups": "no one pass over these KV-cache groups (a sliding window's blocks depend on "
    "its hit): one replay per capacity",
}
NO_GROUPS_TIMED = (
    "this timed replay models one full-attention KV-cache group; sliding-window and "
    "hybrid layouts replay in sequence mode"
)


@dataclass
class TraceReport:
    mode: str
    one_pass: bool
    note: str
    block_size: int
    hash_fn: str
    free_order: str
    results: list[CapacityResult]
    seconds: float
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "one_pass": self.one_pass,
            "note": self.note,
            "block_size": self.block_size,
            "hash": self.hash_fn,
            "free_order": self.free_order,
            "free_order_vllm": FREE_ORDER_VLLM.get(self.free_order),
            "seconds": self.seconds,
            **self.info,
            "results": [
                {**r.to_json(), "mode": self.mode, "one_pass": self.one_pass} for r in self.results
            ],
        }


def replay_trace(
    trace: Trace,
    *,
    mode: str = "sequence",
    block_size: int = 16,
    capacities_tokens: Sequence[int | None] = (None,),
    hash_name: str = "sha256",
    free_order: FreeOrder = DEFAULT_FREE_ORDER,
    timed: TimedConfig | None = None,
    one_pass: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    groups: Sequence[GroupSpec] | None = None,
) -> TraceReport:
    """Replay ``trace``; ``one_pass=None`` uses the curve wherever it is exact.
    ``groups``: the pool's KV-cache groups in sequence mode (None or one
    full-attention group: the plain model); timed mode takes them from
    ``timed`` and refuses them without."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    if free_order not in FREE_ORDERS:
        raise ValueError(f"unknown free order {free_order!r} (known: {', '.join(FREE_ORDERS)})")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block size must be a positive integer, got {block_size!r}")
    if not capacities_tokens:
        raise ValueError("no capacity given")
    hash_fn = get_hash_fn_by_name(hash_name)
    if free_order != APPEND_ALL:
        make_pool(2, block_size, free_order)  # refuses a free order this pool lacks
    grouped = not is_plain(groups)
    if grouped and mode == "timed" and not getattr(timed, "groups", ()):
        raise ValueError(NO_GROUPS_TIMED)  # timed mode takes its groups from its config
    grouped = grouped and mode == "sequence"
    applies = mode == "sequence" and not grouped
    if one_pass and not applies:
        raise ValueError(NO_ONE_PASS["timed" if mode == "timed" else "groups"])
    use = applies if one_pass is None else one_pass
    t0 = time.perf_counter()
    info: dict[str, Any] = {"requests": len(trace), "tokens_per_id": trace.tokens_per_id}
    if grouped:
        assert groups is not None
        info["kv_cache_groups"] = describe_groups(groups)
    if use:
        curve = OnePassCurve(trace, block_size, capacities_tokens, free_order)
        results = curve.run(progress)
        note = ONE_PASS_NOTE.format(free_order=free_order_label(free_order))
        info["stacks"] = curve.stacks
    else:
        if mode == "timed":
            note = NO_ONE_PASS["timed"]
            results = replay_timed(
                trace, block_size, capacities_tokens, hash_fn, free_order, timed, progress
            )
        else:
            note = NO_ONE_PASS["groups" if grouped else "asked"]
            pools = SequencePools(
                trace, block_size, capacities_tokens, hash_fn, free_order, groups=groups
            )
            results = pools.run(progress)
    return TraceReport(
        mode,
        use,
        note,
        block_size,
        hash_name,
        free_order,
        results,
        time.perf_counter() - t0,
        info,
    )
