"""The pool sizes a capacity plan replays (blockpool/trace/plan/capacity_plan.py):
the sizes asked, a sweep's log-spaced ones between them, the KV-cache groups
they are counted over, and the tokens a size holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from blockpool.core.attention import GroupSpec
from blockpool.trace.plan.planner import group_sweep_range, log_grid, sweep_range
from blockpool.trace.replay.optimal import OptimalCurve
from blockpool.trace.replay.sequence_groups import is_plain
from blockpool.trace.sizing.capacity import Capacity, KVLayout, block_bytes_of, parse_capacity_list
from blockpool.trace.workload.reader import Trace


def groups_of(layout: KVLayout | None, block_size: int) -> list[GroupSpec] | None:
    """The layout's KV-cache groups where they are not one full-attention group."""
    if layout is None:
        return None
    specs = layout.group_specs(block_size)
    return None if is_plain(specs) else specs


def capacities_of(
    capacity: str | None,
    block_size: int,
    layout: KVLayout | None,
    legacy: Sequence[int | None] = (),
    legacy_blocks: Sequence[int | None] = (),
) -> list[Capacity]:
    """``capacity`` and the older sizes in tokens (``legacy``) and blocks
    (``legacy_blocks``: num_gpu_blocks, whatever the groups)."""
    bs = block_size
    bb = block_bytes_of(layout, bs)
    ng = 1 if layout is None else layout.num_groups
    caps = [] if capacity is None else parse_capacity_list(capacity, bs, layout)
    for tokens in legacy:
        if tokens is None:
            caps.append(Capacity("inf", None, bs, bb, ng))
        else:
            if tokens // bs < 1:
                raise ValueError(f"{tokens} tokens hold no block of {bs} tokens")
            caps.append(Capacity(str(tokens), tokens // bs * ng, bs, bb, ng))
    for b in legacy_blocks:
        caps.append(Capacity("inf" if b is None else f"{b}b", b, bs, bb, ng))
    return caps or [Capacity("inf", None, bs, bb, ng)]


def sweep_capacities(
    block_size: int,
    points: int,
    caps: list[Capacity],
    optimal: OptimalCurve,
    trace: Trace,
    groups: list[GroupSpec] | None = None,
) -> list[Capacity]:
    """``caps`` and ``points`` log-spaced sizes between their extremes (or,
    with fewer than two finite ones, the trace's own range)."""
    bs = block_size
    finite = sorted(c.blocks for c in caps if c.blocks is not None)
    if len(finite) >= 2:
        lo, hi = max(2, finite[0]), finite[-1]
    elif groups is not None:
        lo, hi = group_sweep_range(trace, groups, optimal)
    else:
        lo, hi = sweep_range(optimal)
    bb, ng = caps[0].block_bytes, caps[0].groups
    grid = log_grid(lo, hi, points)
    have = {c.blocks for c in caps}
    out = list(caps) + [Capacity(f"{b}b", b, bs, bb, ng) for b in grid if b not in have]
    out.sort(key=lambda c: float("inf") if c.blocks is None else c.blocks)
    return out


def usable_tokens_of(blocks: int, bs: int, layout: KVLayout | None) -> int:
    """Tokens every KV-cache group can hold in ``blocks`` (the null block left out)."""
    return (blocks - 1) // (1 if layout is None else layout.num_groups) * bs
