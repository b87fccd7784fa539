"""Capacity planning on a sequence replay: dense sweeps, other policies,
and the smallest pool reaching a hit rate.

Every size here is vLLM's ``num_gpu_blocks`` (null block included): a pool of
``blocks`` holds ``blocks - 1`` usable blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from blockpool.core.free_order import UNCACHED_FIRST
from blockpool.shadow.pool import make_shadow
from blockpool.trace.curve import OnePassCurve
from blockpool.trace.keys import BlockKeys
from blockpool.trace.optimal import OptimalCurve
from blockpool.trace.reader import Trace

# the shadows' policies a curve can also be drawn for (LRU is the replay itself)
SHADOW_POLICIES = ("s3fifo", UNCACHED_FIRST)
POLICIES = ("optimal", *SHADOW_POLICIES)


def log_grid(lo: int, hi: int, points: int) -> list[int]:
    """``points`` block counts from ``lo`` to ``hi``, log-spaced, distinct, sorted."""
    if lo < 2 or hi < lo:
        raise ValueError(f"a sweep needs 2 <= low <= high blocks, got {lo} .. {hi}")
    if points < 2:
        raise ValueError(f"a sweep needs at least 2 points, got {points}")
    ratio = math.log(hi / lo) / (points - 1)
    return sorted({round(lo * math.exp(ratio * i)) for i in range(points)} | {lo, hi})


def sweep_range(trace: Trace, block_size: int, optimal: OptimalCurve) -> tuple[int, int]:
    """(the smallest pool refusing nothing, a pool where the optimum never evicts), in blocks."""
    biggest = max((int(b) for b in optimal.num_blocks), default=1)
    lo = biggest + 1
    return lo, max(lo, optimal.num_keys + biggest + 1)


def policy_hit_tokens(
    trace: Trace, block_size: int, keys: BlockKeys, policy: str, usable_blocks: int
) -> tuple[int, int]:
    """(hit tokens, evictions) of a shadow pool running ``policy`` in sequence mode."""
    if usable_blocks < 1:
        return 0, 0  # the null block alone: every request is refused
    shadow = make_shadow(policy, usable_blocks, block_size)
    admit, finish = shadow.admit, shadow.finish
    for req in trace.requests:
        # the shadow only hashes and compares its keys: the ints stand for the hashes
        names = cast("list[bytes]", keys.keys(req))
        if admit("r", names, req.input_length) >= 0:
            finish("r")
    return shadow.stats.hits, shadow.stats.evictions


@dataclass
class TargetAnswer:
    """The smallest pool (blocks) whose hit rate reaches a target, per policy."""

    target: float
    lru_blocks: int | None  # None: not reached (even unbounded)
    optimal_blocks: int | None
    unbounded_hit_rate: float


def _smallest(
    hits_at: Callable[[list[int]], list[int]], lo: int, hi: int, need: int, per_round: int
) -> int | None:
    """Smallest ``b`` in ``lo .. hi`` with ``hits_at([b])[0] >= need``, evaluating
    ``per_round`` sizes at once (a log grid, then the bracket it finds)."""
    grid = log_grid(lo, hi, per_round) if hi > lo else [lo]
    got = hits_at(grid)
    first = next((i for i, h in enumerate(got) if h >= need), None)
    if first is None:
        return None
    if first == 0:
        return grid[0]
    below, above = grid[first - 1], grid[first]
    while above - below > 1:
        step = max(1, (above - below) // (per_round + 1))
        probe = list(range(below + step, above, step))[:per_round]
        got = hits_at(probe)
        ok = next((p for p, h in zip(probe, got, strict=True) if h >= need), None)
        if ok is None:
            below = probe[-1]
        else:
            i = probe.index(ok)
            below = probe[i - 1] if i else below
            above = ok
    return above


def smallest_capacity(
    trace: Trace,
    block_size: int,
    target: float,
    optimal: OptimalCurve | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TargetAnswer:
    """The fewest blocks at which LRU (the one-pass curve) and the optimum reach
    ``target`` (a hit-token fraction of all prompt tokens).  Found on a log grid
    from 2 blocks up, then by bisection in the bracket: exact where the curve
    rises monotonically, as LRU and the optimum do on real traffic."""
    if not 0 < target <= 1:
        raise ValueError(f"--target-hit-rate must be in (0, 1], got {target}")
    opt = optimal if optimal is not None else OptimalCurve(trace, block_size)
    prompt = trace.prompt_tokens
    unbounded = opt.hit_blocks(None) * block_size
    need = math.ceil(target * prompt)
    rounds = [0]

    def lru(blocks: list[int]) -> list[int]:
        rounds[0] += 1
        if progress is not None:
            progress(rounds[0], rounds[0] + 1)
        res = OnePassCurve(trace, block_size, [b * block_size for b in blocks]).run()
        return [r.hit_tokens for r in res]

    def best(blocks: list[int]) -> list[int]:
        return [opt.hit_blocks(b - 1) * block_size for b in blocks]

    if unbounded < need:
        return TargetAnswer(target, None, None, unbounded / prompt if prompt else 0.0)
    _, hi = sweep_range(trace, block_size, opt)
    lru_b = _smallest(lru, 2, hi, need, 16)
    opt_b = _smallest(best, 2, hi if lru_b is None else lru_b, need, 16)
    if progress is not None:
        progress(1, 1)
    return TargetAnswer(target, lru_b, opt_b, unbounded / prompt if prompt else 0.0)


def shadow_curve(
    trace: Trace,
    block_size: int,
    keys: BlockKeys,
    policy: str,
    usable: Sequence[int | None],
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[int, int] | None]:
    """``policy_hit_tokens`` at each usable size (None where unbounded: not a shadow)."""
    if policy not in SHADOW_POLICIES:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    out: list[tuple[int, int] | None] = []
    for i, u in enumerate(usable):
        out.append(None if u is None else policy_hit_tokens(trace, block_size, keys, policy, u))
        if progress is not None:
            progress(i + 1, len(usable))
    return out


def bound_at(trace: Trace, block_size: int, num_blocks: int) -> dict[str, float | int | str]:
    """LRU, the offline optimum and the unbounded ceiling for one pool of
    ``num_blocks`` (null block included), requests one at a time."""
    keys = BlockKeys(trace, block_size)
    curve = OnePassCurve(trace, block_size, [num_blocks * block_size])
    curve.keys = keys
    (lru,) = curve.run()
    opt = OptimalCurve(trace, block_size, keys)
    prompt = trace.prompt_tokens or 1
    best = opt.hit_blocks(num_blocks - 1) * block_size
    ceiling = opt.hit_blocks(None) * block_size
    return {
        "model": "sequence",
        "blocks": num_blocks,
        "prompt_tokens": trace.prompt_tokens,
        "lru_hit_rate": lru.hit_tokens / prompt,
        "optimal_hit_rate": best / prompt,
        "unbounded_hit_rate": ceiling / prompt,
    }
