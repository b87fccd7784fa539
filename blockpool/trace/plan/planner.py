"""Capacity planning on a sequence replay: dense sweeps, other policies,
and the smallest pool reaching a hit rate.

Every size here is vLLM's ``num_gpu_blocks`` (null block included): a pool of
``blocks`` holds ``blocks - 1`` usable blocks.

Over sliding-window KV-cache groups (a sliding-window or hybrid model) there
is no one-pass curve and no offline optimum: every capacity is an exact
replay of its own (``sequence_groups.py``), and :data:`NO_OPTIMUM` says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from blockpool.core.attention import GroupSpec
from blockpool.core.free_order import UNCACHED_FIRST, FreeOrder
from blockpool.core.hashing import HashFn
from blockpool.shadow.pool import make_shadow
from blockpool.trace.plan.report import DEFAULT_FREE_ORDER
from blockpool.trace.replay.curve import OnePassCurve
from blockpool.trace.replay.optimal import OptimalCurve
from blockpool.trace.replay.sequence import SequencePools
from blockpool.trace.replay.sequence_groups import prompt_blocks, unbounded_group_blocks
from blockpool.trace.workload.keys import BlockKeys, trace_chains
from blockpool.trace.workload.reader import Trace

# the shadows' policies a curve can also be drawn for (LRU is the replay itself)
SHADOW_POLICIES = ("s3fifo", UNCACHED_FIRST)
POLICIES = ("optimal", *SHADOW_POLICIES)
TARGET_POINTS = 48  # sizes one pass of the curve answers in a target search

NO_OPTIMUM = (
    "no offline optimum over sliding-window KV-cache groups: the blocks a request holds "
    "and looks up depend on its hit (a window never looks left of its run and frees what "
    "falls out of it), so there is neither one reference stream for every policy (Belady's "
    "MIN) nor LRU's inclusion property (the one-pass curve); each capacity is an exact "
    "replay of its own"
)
NO_SHADOWS = (
    "the shadow policies ({policies}) replay one full-attention group; over sliding-window "
    "KV-cache groups they are not offered (give --policies none)"
)
GROUP_SEARCH = (
    "exact replays on a log grid of 16 sizes, then bisection in the first bracket that "
    "reaches the target: with a sliding window the curve need not rise monotonically, so "
    "this is a size that reaches it with no evaluated smaller size reaching it, the smallest "
    "one where the curve rises monotonically"
)


def log_grid(lo: int, hi: int, points: int) -> list[int]:
    """``points`` block counts from ``lo`` to ``hi``, log-spaced, distinct, sorted."""
    if lo < 2 or hi < lo:
        raise ValueError(f"a sweep needs 2 <= low <= high blocks, got {lo} .. {hi}")
    if points < 2:
        raise ValueError(f"a sweep needs at least 2 points, got {points}")
    ratio = math.log(hi / lo) / (points - 1)
    return sorted({round(lo * math.exp(ratio * i)) for i in range(points)} | {lo, hi})


def sweep_range(optimal: OptimalCurve) -> tuple[int, int]:
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
    optimal_reason: str | None = None  # why no optimum is searched (KV-cache groups)
    search: str | None = None  # how the LRU size was searched, where it is not exact
    # sizes searched from here up: the smallest pool refusing no request (None: from 2)
    floor_blocks: int | None = None


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
    free_order: FreeOrder = DEFAULT_FREE_ORDER,
    per_pass: int = TARGET_POINTS,
) -> TargetAnswer:
    """The fewest blocks at which LRU (the one-pass curve, under ``free_order``)
    and the optimum reach ``target`` (a hit-token fraction of all prompt tokens).

    Only pools refusing no request are answers (``floor_blocks``, the largest
    prompt's blocks and the null block, and up): a smaller pool turns the
    longest prompts away, and by not storing them can even hit more than a
    larger one -- a size no operator can deploy.  One pass of the curve
    answers ``per_pass`` sizes at once: a log grid from that floor to a pool
    where the optimum never evicts, then passes over evenly spaced sizes
    inside the bracket found, until it is one block wide (a handful of
    passes: each narrows it ``per_pass + 1`` times).  The optimum, never below
    LRU, is bisected under LRU's answer (one heap pass a size).  Exact where
    the curve rises: without refusals and duplicate copies a smaller pool's
    cached blocks are always among a larger one's (the inclusion property,
    docs/sizing.md), and so are its hits.  ``progress``: passes done."""
    if not 0 < target <= 1:
        raise ValueError(f"--target-hit-rate must be in (0, 1], got {target}")
    opt = optimal if optimal is not None else OptimalCurve(trace, block_size)
    prompt = trace.prompt_tokens
    unbounded = opt.hit_blocks(None) * block_size
    need = math.ceil(target * prompt)
    chains = trace_chains(trace, block_size)
    rounds = [0]
    lo, hi = sweep_range(opt)
    # passes: the grid, then each narrows the bracket per_pass + 1 times
    most = 2 + math.ceil(math.log(max(2, hi - lo)) / math.log(per_pass + 1))

    def lru(blocks: list[int]) -> list[int]:
        rounds[0] += 1
        curve = OnePassCurve(
            trace, block_size, [b * block_size for b in blocks], free_order, chains=chains
        )
        res = curve.run()
        if progress is not None:
            progress(rounds[0], max(most, rounds[0] + 1))
        return [r.hit_tokens for r in res]

    def best(blocks: list[int]) -> list[int]:
        return [opt.hit_blocks(b - 1) * block_size for b in blocks]

    rate = unbounded / prompt if prompt else 0.0
    if unbounded < need:
        return TargetAnswer(target, None, None, rate, floor_blocks=lo)
    lru_b = _smallest(lru, lo, hi, need, per_pass)
    # the optimum is never below LRU: it reaches the target at lru_b at the latest
    top = hi if lru_b is None else lru_b
    if best([lo])[0] >= need:
        opt_b: int | None = lo
    elif best([top])[0] < need:
        opt_b = None
    else:
        opt_b = _bisect(lambda b: best([b])[0], lo, top, need)
    if progress is not None:
        progress(rounds[0], rounds[0])
    return TargetAnswer(target, lru_b, opt_b, rate, floor_blocks=lo)


def _bisect(hits_at: Callable[[int], int], below: int, above: int, need: int) -> int:
    """Smallest ``b`` in ``below + 1 .. above`` with ``hits_at(b) >= need``,
    given ``hits_at(below) < need <= hits_at(above)`` and a rising curve."""
    while above - below > 1:
        mid = (below + above) // 2
        if hits_at(mid) >= need:
            above = mid
        else:
            below = mid
    return above


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


def bound_at(
    trace: Trace, block_size: int, num_blocks: int, free_order: FreeOrder = DEFAULT_FREE_ORDER
) -> dict[str, float | int | str]:
    """LRU (under ``free_order``), the offline optimum and the unbounded ceiling
    for one pool of ``num_blocks`` (null block included), requests one at a time."""
    keys = BlockKeys(trace, block_size)
    curve = OnePassCurve(trace, block_size, [num_blocks * block_size], free_order)
    curve.keys = keys
    (lru,) = curve.run()
    opt = OptimalCurve(trace, block_size, keys)
    prompt = trace.prompt_tokens or 1
    best = opt.hit_blocks(num_blocks - 1) * block_size
    ceiling = opt.hit_blocks(None) * block_size
    return {
        "model": "sequence",
        "free_order": free_order,
        "blocks": num_blocks,
        "prompt_tokens": trace.prompt_tokens,
        "lru_hit_rate": lru.hit_tokens / prompt,
        "optimal_hit_rate": best / prompt,
        "unbounded_hit_rate": ceiling / prompt,
    }


# ---------------------------------------------------- KV-cache groups (windows)


def group_unbounded_hit_tokens(block_size: int, optimal: OptimalCurve) -> int:
    """The unbounded ceiling over any KV-cache groups sharing ``block_size``:
    the compulsory-miss bound of one full-attention group, ``sum_t min(c_t,
    h_t) * block_size`` (``c_t``: the leading blocks of request ``t`` stored
    by an earlier request, ``h_t``: its hit limit).

    Why it bounds every capacity and every policy of the group replay.  A
    block hash names the whole prefix up to it, so a cached block of request
    ``t`` at index ``i`` was stored by an earlier request holding the same
    prefix: ``i < c_t``.  A full-attention group's hit is a run of cached
    blocks from index 0, so at most ``c_t`` blocks.  A sliding window's hit
    ends on a cached block (its run) or is the cached run from index 0, so it
    is at most ``c_t`` blocks as well, and a hybrid hit is at most each of its
    groups'.  Every walk stops at ``h_t`` blocks (the last prompt token is
    always computed) and alignment only shortens.  So no request hits more
    than ``min(c_t, h_t)`` blocks at any size.  And an unbounded pool reaches
    it: there every block stored is still cached, each group's cached blocks
    of ``t`` are exactly its first ``c_t``, and every walk returns them all --
    the bound is the unbounded replay's hit count, not only above it."""
    return optimal.hit_blocks(None) * block_size


def group_sweep_range(
    trace: Trace, specs: Sequence[GroupSpec], optimal: OptimalCurve
) -> tuple[int, int]:
    """(the smallest pool refusing nothing, one holding every distinct full
    block in every group besides the largest prompt), in blocks.  A hit never
    needs more blocks than the prompt with no hit, so the largest prompt's
    blocks in every group (and the null block) refuse nothing."""
    lo = max((prompt_blocks(r.input_length, specs) for r in trace.requests), default=1) + 1
    return lo, max(lo, optimal.num_keys * len(specs) + lo)


def group_hit_tokens(
    trace: Trace,
    specs: Sequence[GroupSpec],
    num_blocks: Sequence[int],
    hash_fn: HashFn,
    free_order: FreeOrder = DEFAULT_FREE_ORDER,
) -> list[int]:
    """Hit tokens of the exact group replay at each pool size (blocks)."""
    bs = min(s.block_size for s in specs)
    pools = SequencePools(
        trace, bs, [b * bs for b in num_blocks], hash_fn, free_order, groups=specs
    )
    return [r.hit_tokens for r in pools.run()]


def smallest_group_capacity(
    trace: Trace,
    specs: Sequence[GroupSpec],
    target: float,
    hash_fn: HashFn,
    optimal: OptimalCurve | None = None,
    progress: Callable[[int, int], None] | None = None,
    free_order: FreeOrder = DEFAULT_FREE_ORDER,
) -> TargetAnswer:
    """The fewest blocks at which the group replay reaches ``target`` (see
    :data:`GROUP_SEARCH` for what "fewest" means there); no optimum."""
    if not 0 < target <= 1:
        raise ValueError(f"--target-hit-rate must be in (0, 1], got {target}")
    bs = min(s.block_size for s in specs)
    opt = optimal if optimal is not None else OptimalCurve(trace, bs)
    prompt = trace.prompt_tokens
    ceiling = group_unbounded_hit_tokens(bs, opt)
    rate = ceiling / prompt if prompt else 0.0
    need = math.ceil(target * prompt)
    if ceiling < need:
        return TargetAnswer(target, None, None, rate, NO_OPTIMUM, GROUP_SEARCH)
    rounds = [0]

    def replay(blocks: list[int]) -> list[int]:
        rounds[0] += 1
        if progress is not None:
            progress(rounds[0], rounds[0] + 1)
        return group_hit_tokens(trace, specs, blocks, hash_fn, free_order)

    _, hi = group_sweep_range(trace, specs, opt)
    found = _smallest(replay, 2, hi, need, 16)
    if found is None:  # copies of a block evicted at ``hi``: up to a pool never evicting,
        # whose replay reaches the ceiling (group_unbounded_hit_tokens)
        found = _smallest(replay, hi, unbounded_group_blocks(trace, specs), need, 16)
    if progress is not None:
        progress(1, 1)
    return TargetAnswer(target, found, None, rate, NO_OPTIMUM, GROUP_SEARCH)
