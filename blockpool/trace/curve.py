"""The whole hit-rate curve of a sequence replay in one pass.

Where it applies: ``--mode sequence`` (requests one at a time, prompt blocks
only, all freed in reverse before the next), vLLM 0.16's free order
(``append_all``: every freed block to the queue's tail), caching on.  Not
in timed mode (blocks are held across requests) nor with another free order
(``uncached_first`` puts unhashed blocks at the head): there, replay one pool
per capacity (``sequence.replay_pools`` / ``timed``).

Why one pass is exact.  Between two requests every block but the null block
is free, so a pool of ``M = blocks - 1`` usable blocks *is* its free queue:
``M`` blocks, head = next reused.  A request removes its ``k`` hits from the
queue, pops ``P - k`` blocks from the head and appends its ``P`` blocks in
reverse.  So the queue is always the last ``M`` entries of one sequence ``G``
of block contents (hashed, or empty: the pool's never-used blocks and the
partial tail blocks) in which each request moves its hits to the end and
appends its other blocks: Mattson's LRU stack.  ``G`` does not depend on
``M``; a capacity is a boundary in it, a block is cached at ``M`` when it
sits above the boundary, and the ``P - k`` pops are the boundary moving up
over that many live entries (the hashed ones among them are the evictions).
A freed child always lands before its parent in the queue, so the cached
blocks of a chain are a prefix of it and their positions in ``G`` fall
along the chain: the hits at every capacity are one binary search each.

Where capacities part.  (1) A request with more blocks than ``M`` is refused
at ``M`` and changes nothing there, while larger pools take it.  (2) Two
cached copies of one hash (a prompt ending on a block boundary stores its
last block again: it is never a hit) -- a later hit touches the *first
stored* copy still cached, which can differ by capacity.  In both cases the
capacities involved no longer share ``G``: the stack is copied and each
group goes on alone (:meth:`OnePassCurve.stacks` counts them).  Each copy
splits a set of capacities in two, so there are at most ``len(capacities)``
stacks, and the result stays exact for every capacity asked for.

No hashing is needed: blocks are named by :class:`~blockpool.trace.keys.BlockKeys`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from blockpool.trace.keys import BlockKeys, trace_chains
from blockpool.trace.reader import Trace
from blockpool.trace.results import CapacityResult, capacity_blocks

_BIG = 1 << 62  # an unbounded capacity's usable blocks: its never-used blocks never run out

IntArray = npt.NDArray[np.int64]
ByteArray = npt.NDArray[np.uint8]
BoolArray = npt.NDArray[np.bool_]


class _Stack:
    """One LRU stack ``G`` shared by a group of capacities (numpy columns:
    the per-request work is a few array operations, not a loop per block).

    The per-capacity columns (``caps``, ``usable``, ``bound``, ``empties``,
    ``hits``, ``last``) are lists in the same order."""

    __slots__ = (
        "acc",
        "bound",
        "caps",
        "empties",
        "extra",
        "hits",
        "last",
        "least",
        "live",
        "multi",
        "parts",
        "pos",
        "top",
        "usable",
    )

    def __init__(self, caps: list[int], usable: list[int], num_keys: int, length: int) -> None:
        self.caps = caps  # result indices
        self.usable = usable  # usable blocks (_BIG: unbounded)
        self.bound = [0] * len(caps)  # the queue's head in G, per capacity
        self.empties = list(usable)  # never-used blocks left, per capacity
        self.hits = [0] * len(caps)  # hit blocks, per capacity
        self.last = [0] * len(caps)  # cached blocks holding the last token, per capacity
        self.live: BoolArray = np.zeros(length, dtype=np.bool_)  # entries not moved up
        self.parts: list[int] = []  # positions of the unhashed entries, rising (never moved)
        self.pos: IntArray = np.full(num_keys, -1, dtype=np.int64)  # key -> top live copy
        self.multi: ByteArray = np.zeros(num_keys, dtype=np.uint8)  # key -> 1: in ``extra``
        self.extra: dict[int, list[int]] = {}  # key -> copies' positions, first stored first
        self.top = 0
        # admitted, partial tail blocks, cold blocks, stored blocks seen: the same
        # for every capacity of the stack (added to their results at the end)
        self.acc = [0, 0, 0, 0]
        self.least = min(usable, default=_BIG)  # refusals start below this many blocks

    def split(self, take: set[int]) -> _Stack:
        """A copy of the stack for the capacities (result indices) in ``take``,
        which leave this one."""
        other = _Stack.__new__(_Stack)
        idx = [i for i, c in enumerate(self.caps) if c in take]
        rest = [i for i, c in enumerate(self.caps) if c not in take]
        for name in ("caps", "usable", "bound", "empties", "hits", "last"):
            col = getattr(self, name)
            setattr(other, name, [col[i] for i in idx])
            setattr(self, name, [col[i] for i in rest])
        other.live = self.live.copy()
        other.pos = self.pos.copy()
        other.multi = self.multi.copy()
        other.parts = list(self.parts)
        other.extra = {k: list(v) for k, v in self.extra.items()}
        other.top = self.top
        other.acc = list(self.acc)
        other.least = min(other.usable, default=_BIG)
        self.least = min(self.usable, default=_BIG)
        return other


def _advance(live: BoolArray, b: int, x: int) -> int:
    """Skip ``x`` live entries from ``b`` upward: the new boundary (the
    entries at and above the stack's top are all dead).  A boundary anywhere
    after the ``x``-th live entry and up to the next one is the same queue."""
    for _ in range(3):  # counting is cheaper than finding, while the gaps are few
        c = int(np.count_nonzero(live[b : b + x]))
        b += x
        x -= c
        if not x:
            return b
    w = 2 * x if x > 32 else 64
    while True:
        idx = live[b : b + w].nonzero()[0]
        if len(idx) >= x:
            return b + int(idx[x - 1]) + 1
        if b + w >= len(live):
            raise AssertionError("boundary ran past the stack's top")
        x -= len(idx)
        b += w
        w *= 2


def tally_reasons(
    res: CapacityResult, last_token: int, partial: int, evicted: int, cold: int
) -> None:
    """One capacity's miss reasons from the curve's sums."""
    reasons = res.miss_reasons
    reasons["last_token"] = last_token
    reasons["block_size_floor"] = partial
    reasons["evicted"] = evicted
    reasons["cold"] = cold
    res.regret_blocks = evicted


class OnePassCurve:
    """Exact sequence-mode counts for many capacities, one pass over the trace."""

    def __init__(
        self, trace: Trace, block_size: int, capacities_tokens: Sequence[int | None]
    ) -> None:
        self.trace = trace
        self.block_size = block_size
        self.keys = BlockKeys(trace, block_size)
        self.results: list[CapacityResult] = []
        self.usable: list[int | None] = []
        for cap in capacities_tokens:
            blocks = capacity_blocks(cap, block_size)
            if blocks is not None and blocks < 1:
                raise ValueError(f"{cap} tokens hold no block of {block_size} tokens")
            self.results.append(CapacityResult(cap, blocks))
            self.usable.append(None if blocks is None else blocks - 1)
        self._stacks: list[_Stack] = []
        self.splits = 0  # stacks copied (refusals and copies)
        self.copy_splits = 0  # of which: capacities touching different copies

    @property
    def stacks(self) -> int:
        return len(self._stacks)

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[CapacityResult]:
        reqs = self.trace.requests
        total = len(reqs)
        bs = self.block_size
        chains = trace_chains(self.trace, bs)
        if self.results:
            num_keys = max((int(c.max()) for c in chains if len(c)), default=-1) + 1
            length = sum(-(-r.input_length // bs) for r in reqs) + 1
            usable = [_BIG if u is None else u for u in self.usable]
            self._stacks = [_Stack(list(range(len(self.results))), usable, num_keys, length)]
        step = self._step
        for i, req in enumerate(reqs):
            n = req.input_length
            chain = chains[i]
            num_full = len(chain)
            max_hit = (n - 1) // bs
            if max_hit > num_full:
                max_hit = num_full
            num_blocks = -(-n // bs)
            for stack in list(self._stacks):
                step(stack, n, num_blocks, num_full, max_hit, chain)
            if progress is not None and (i & 63 == 63 or i + 1 == total):
                progress(i + 1, total)
        self._count(sum(r.input_length for r in reqs))
        return self.results

    def _count(self, prompt_tokens: int) -> None:
        """Each capacity's counts from its stack's and its own sums.

        Every hashed entry a capacity stored was hit once (one hit block),
        evicted, or is still in its queue at the end: the evictions are what
        is left of the stored blocks."""
        bs = self.block_size
        for stack in self._stacks:
            admitted, partial, cold, seen = stack.acc
            live, top = stack.live, stack.top
            for i, c in enumerate(stack.caps):
                res = self.results[c]
                k, last = stack.hits[i], stack.last[i]
                res.prompt_tokens = prompt_tokens
                res.admitted = admitted
                res.hit_tokens = k * bs
                if stack.empties[i]:  # a never-used block left: nothing was evicted
                    res.evictions = 0
                else:
                    b = stack.bound[i]
                    cached = int(np.count_nonzero(live[b:top]))  # unhashed ones too
                    cached -= len(stack.parts) - bisect_left(stack.parts, b)
                    res.evictions = cold + seen - k - cached
                tally_reasons(res, last, partial, seen - k - last, cold)

    # ----------------------------------------------------------- one request

    def step(self, num_tokens: int, chain: IntArray) -> None:
        """One request: ``chain``, its full blocks' keys (``BlockKeys.keys``).

        Refusals are counted at once, the other counts when :meth:`run` ends."""
        bs = self.block_size
        num_full = len(chain)
        max_hit = min((num_tokens - 1) // bs, num_full)
        for stack in list(self._stacks):
            self._step(stack, num_tokens, -(-num_tokens // bs), num_full, max_hit, chain)

    def _part(self, stack: _Stack, take: set[int]) -> _Stack:
        part = stack.split(take)
        self._stacks.append(part)
        self.splits += 1
        return part

    def _step(
        self,
        stack: _Stack,
        num_tokens: int,
        num_blocks: int,
        num_full: int,
        max_hit: int,
        chain: IntArray,
    ) -> None:
        if num_blocks > stack.least:
            refused = {c for c, u in zip(stack.caps, stack.usable, strict=True) if u < num_blocks}
            for c in refused:
                r = self.results[c]
                r.refused += 1
                r.refused_tokens += num_tokens
            if len(refused) == len(stack.caps):
                return
            self._part(stack, refused)
        bound = stack.bound
        pos = stack.pos
        olds = pos[chain]  # -1: never stored in this stack; falling along the chain
        if num_full:
            # entries at or above each boundary: a prefix of the chain
            q = olds[::-1].searchsorted([0, *bound]).tolist()
            seen = num_full - q[0]
            top_hits = num_full - min(q[1:])
            hits = [(h if (h := num_full - x) < max_hit else max_hit) for x in q[1:]]
            k_top = top_hits if top_hits < max_hit else max_hit
        else:
            seen = k_top = 0
            hits = [0] * len(bound)
        extra, multi = stack.extra, stack.multi
        chosen: dict[int, tuple[int, list[int]]] = {}
        flagged = bool(extra) and num_full > 0 and np.count_nonzero(multi[chain]) > 0
        if flagged and k_top:
            for j in range(k_top):
                copies = extra.get(int(chain[j]))
                if copies is None:
                    continue
                groups: dict[int, set[int]] = {}
                for c, k, b in zip(stack.caps, hits, bound, strict=True):
                    if k > j:
                        idx = next(i for i, p in enumerate(copies) if p >= b)
                        groups.setdefault(idx, set()).add(c)
                if len(groups) > 1:  # capacities touch different copies: part them
                    for group in list(groups.values())[1:]:
                        part = self._part(stack, group)
                        self.copy_splits += 1
                        self._step(part, num_tokens, num_blocks, num_full, max_hit, chain)
                    self._step(stack, num_tokens, num_blocks, num_full, max_hit, chain)
                    return
                (idx,) = groups
                chosen[j] = (idx, copies)

        # --- update G: hits move to the top, the rest are new entries
        live = stack.live
        if k_top:
            if chosen:
                kills = olds[:k_top].copy()
                for j, (idx, copies) in chosen.items():
                    kills[j] = copies[idx]
                live[kills] = 0
            else:
                live[olds[:k_top]] = 0
        t = stack.top
        hi = t + num_blocks - 1  # block j lands at hi - j
        partial = 1 if num_blocks > num_full else 0
        if partial:
            stack.parts.append(t)
        live[t : t + num_blocks] = True
        if num_full:
            pos[chain] = np.arange(hi, hi - num_full, -1, dtype=np.int64)
        stack.top = t + num_blocks
        for j, (idx, copies) in chosen.items():
            copies[idx] = hi - j
        last = num_full - 1
        stored_last = max_hit < num_full and seen == num_full  # the last block was stored
        old_last = int(olds[last]) if stored_last else -1
        # (an unbounded capacity's boundary stays 0: the block is cached there)
        dup = stored_last and old_last >= min(bound)
        if flagged and k_top < num_full:
            for j in range(k_top, num_full - 1 if dup else num_full):
                key = int(chain[j])
                if extra.pop(key, None) is not None:
                    multi[key] = 0
        if dup:  # the last block is stored again while a copy is cached
            key = int(chain[last])
            copies = extra.get(key)
            if copies is None:
                extra[key] = [old_last, hi - last]
                multi[key] = 1
            else:
                copies.append(hi - last)
            lt = stack.last
            for i, b in enumerate(bound):
                if old_last >= b:
                    lt[i] += 1

        # --- per capacity: pops from the head (never-used blocks first)
        acc = stack.acc
        acc[0] += 1
        acc[1] += partial
        acc[2] += num_full - seen
        acc[3] += seen
        hk, empties = stack.hits, stack.empties
        count_nonzero = np.count_nonzero
        for i, k in enumerate(hits):
            hk[i] += k
            x = num_blocks - k
            e = empties[i]
            if e:
                if e >= x:
                    empties[i] = e - x
                    continue
                empties[i] = 0
                x -= e
            b = bound[i]
            c = int(count_nonzero(live[b : b + x]))
            bound[i] = b + x if c == x else _advance(live, b + x, x - c)


def one_pass_curve(
    trace: Trace,
    block_size: int,
    capacities_tokens: Sequence[int | None],
    progress: Callable[[int, int], None] | None = None,
) -> list[CapacityResult]:
    """Sequence-mode results at every capacity, from one pass (see the module)."""
    curve = OnePassCurve(trace, block_size, capacities_tokens)
    results = curve.run(progress)
    for r in results:
        r.extra["stacks"] = curve.stacks
    return results
