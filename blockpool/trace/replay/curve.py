"""The whole hit-rate curve of a sequence replay in one pass, under either
free order.

Where it applies: ``--mode sequence`` (requests one at a time, prompt blocks
only, all freed in reverse before the next), caching on, vLLM 0.16's free
order (``append_all``: every freed block to the queue's tail) or vLLM >=
0.24's (``uncached_first``: a freed block without a hash -- the partial tail
block -- to the head).  Not in timed mode (blocks are held across requests):
there, replay one pool per capacity (``timed``).

Why one pass is exact under ``append_all``.  Between two requests every
block but the null block is free, so a pool of ``M = blocks - 1`` usable
blocks *is* its free queue: ``M`` blocks, head = next reused.  A request
removes its ``k`` hits from the queue, pops ``P - k`` blocks from the head
and appends its ``P`` blocks in reverse.  So the queue is always the last
``M`` entries of one sequence ``G`` of block contents (hashed, or empty: the
pool's never-used blocks and the partial tail blocks) in which each request
moves its hits to the end and appends its other blocks: Mattson's LRU
stack.  ``G`` does not depend on ``M``; a capacity is a boundary in it, a
block is cached at ``M`` when it sits above the boundary, and the ``P - k``
pops are the boundary moving up over that many live entries (the hashed
ones among them are the evictions).  A freed child always lands before its
parent in the queue, so the cached blocks of a chain are a prefix of it and
their positions in ``G`` fall along the chain: the hits at every capacity
are one binary search each.

Under ``uncached_first`` (the proof in full: docs/sizing.md).  The queue is
always ``H`` (``h`` hashless blocks: never used, or freed partial ones) then
``C`` (the hashed ones, least recent first): a pop takes the head, a freed
hashless block goes before ``H``, a hashed one after ``C``.  ``G`` now holds
the hashed entries only, ``C`` is the live entries above the boundary, and a
request's ``P - k`` pops take ``min(h, P - k)`` hashless blocks and evict
``e = max(0, P - k - h)`` entries of ``C`` from its head; then ``h`` becomes
``max(h - (P - k), 0) + p`` (``p``: its partial block, 0 or 1).  Afterwards
``C`` holds the chain's ``F`` full blocks and the newest ``min(|C| - k,
M - P)`` of its other entries.  Both terms grow with ``M`` when ``C`` does
(``|C| - k`` counts the live entries above the boundary outside the chain),
so a smaller pool's cached blocks stay among a larger one's: the inclusion
property holds, the boundaries share one ``G``, and only ``h`` is kept per
capacity.  The prefix rule and the binary search are unchanged.

Where capacities part (either order).  (1) A request with more blocks than
``M`` is refused at ``M`` and changes nothing there, while larger pools take
it.  (2) Two cached copies of one hash (a prompt ending on a block boundary
stores its last block again: it is never a hit) -- a later hit touches the
*first stored* copy still cached, which can differ by capacity.  In both
cases the capacities involved no longer share ``G``: the stack is copied
and each group goes on alone (:meth:`OnePassCurve.stacks` counts them).
Each copy splits a set of capacities in two, so there are at most
``len(capacities)`` stacks, and the result stays exact for every capacity
asked for.  A copy shares the first stack's key -> position map (positions
are the same in every stack; a refused request leaves its own empty) and
corrects it only where the first stack last stored a key in a request the
copy refused.

Evictions are counted at the end: every hashed entry a capacity stored was
hit once, was evicted, or is still in its queue.

No hashing is needed: blocks are named by :class:`~blockpool.trace.workload.keys.BlockKeys`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from blockpool.core.admission import cdiv, hit_limit
from blockpool.core.free_order import APPEND_ALL, UNCACHED_FIRST, FreeOrder, check_free_order
from blockpool.trace.replay.lru_stack import BIG, IntArray, SharedStack, advance_boundary
from blockpool.trace.replay.results import CapacityResult, capacity_blocks
from blockpool.trace.workload.keys import BlockKeys, trace_chains
from blockpool.trace.workload.reader import Trace


class OnePassCurve:
    """Exact sequence-mode counts for many capacities, one pass over the trace."""

    def __init__(
        self,
        trace: Trace,
        block_size: int,
        capacities_tokens: Sequence[int | None],
        free_order: FreeOrder = APPEND_ALL,
        *,
        record_hits: bool = False,
        chains: Sequence[IntArray] | None = None,
    ) -> None:
        self.trace = trace
        self.block_size = block_size
        self.free_order = check_free_order(free_order)
        # uncached_first: a freed hashless block goes to the queue's head (module doc)
        self._head_uncached = free_order == UNCACHED_FIRST
        self.keys = BlockKeys(trace, block_size)
        self._chains = chains  # trace_chains(trace, block_size), when the caller has them
        self.results: list[CapacityResult] = []
        self.usable: list[int | None] = []
        for cap in capacities_tokens:
            blocks = capacity_blocks(cap, block_size)
            if blocks is not None and blocks < 1:
                raise ValueError(f"{cap} tokens hold no block of {block_size} tokens")
            self.results.append(CapacityResult(cap, blocks))
            self.usable.append(None if blocks is None else blocks - 1)
        self._stacks: list[SharedStack] = []
        self.pos: IntArray = np.zeros(0, dtype=np.int64)  # key -> top copy (first stack's)
        self.top = 0  # G's length
        self._seen = 0  # the chain's keys the first stack stored before (this request)
        self._since_prune = 0
        self._most = 0  # the largest capacity's usable blocks
        self.splits = 0  # stacks copied (refusals and copies)
        self.copy_splits = 0  # of which: capacities touching different copies
        # per capacity, each request's hit blocks (-1: refused), when asked
        self.request_hits: list[list[int]] | None = (
            [[] for _ in self.results] if record_hits else None
        )

    @property
    def stacks(self) -> int:
        return len(self._stacks)

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[CapacityResult]:
        reqs = self.trace.requests
        total = len(reqs)
        bs = self.block_size
        chains = self._chains if self._chains is not None else trace_chains(self.trace, bs)
        lens = np.fromiter((r.input_length for r in reqs), np.int64, total)
        if self.results:
            # a key is numbered after its parent's: a chain's last key is its largest
            num_keys = max((int(c[-1]) for c in chains if len(c)), default=-1) + 1
            length = int((-(-lens // bs)).sum()) + 1
            usable = [BIG if u is None else u for u in self.usable]
            self.pos = np.full(num_keys, -1, dtype=np.int64)
            # the first stack holds the largest capacity: it refuses only what all refuse
            self._most = max(usable)
            self._stacks = [SharedStack(list(range(len(self.results))), usable, num_keys, length)]
        step = self.step
        for i, (n, chain) in enumerate(zip(lens.tolist(), chains, strict=True)):
            step(n, chain)
            if progress is not None and (i & 63 == 63 or i + 1 == total):
                progress(i + 1, total)
        self._count(int(lens.sum()))
        return self.results

    def _count(self, prompt_tokens: int) -> None:
        """Each capacity's counts from its stack's and its own sums.

        Every hashed entry a capacity stored was hit once (one hit block),
        evicted, or is still in its queue at the end: the evictions are what
        is left of the stored blocks."""
        bs = self.block_size
        for stack in self._stacks:
            admitted, partial, cold, seen = stack.acc
            live, top = stack.live, self.top
            for i, c in enumerate(stack.caps):
                res = self.results[c]
                k, last = stack.hits[i], stack.last[i]
                res.prompt_tokens = prompt_tokens
                res.admitted = admitted
                res.hit_tokens = k * bs
                if stack.empties[i] and not self._head_uncached:
                    res.evictions = 0  # a never-used block left: nothing was evicted
                else:
                    b = stack.bound[i]
                    cached = int(np.count_nonzero(live[b:top]))  # unhashed ones too
                    cached -= len(stack.parts) - bisect_left(stack.parts, b)
                    res.evictions = cold + seen - k - cached
                res.misses.add_counts(last, partial, seen - k - last, cold)

    # ----------------------------------------------------------- one request

    def step(self, num_tokens: int, chain: IntArray) -> None:
        """One request: ``chain``, its full blocks' keys (``BlockKeys.keys``).

        Refusals are counted at once, the other counts when :meth:`run` ends."""
        bs = self.block_size
        num_full = len(chain)
        max_hit = hit_limit(num_tokens, bs, num_full)
        num_blocks = cdiv(num_tokens, bs)
        stacks = self._stacks
        if not stacks:
            return
        if num_blocks > self._most:  # refused everywhere: nothing moves
            for stack in stacks:
                self._refuse(stack.caps, num_tokens)
            return
        pos = self.pos
        olds = pos[chain]  # -1: never stored; falling along the chain
        for stack in list(stacks):
            self._step(stack, num_tokens, num_blocks, num_full, max_hit, chain, olds)
        top = self.top
        hi = top + num_blocks - 1  # block j lands at hi - j
        if num_full:
            pos[chain] = np.arange(hi, hi - num_full, -1, dtype=np.int64)
        self.top = top + num_blocks
        self._since_prune += 1
        if self._since_prune == 16:  # now and then
            self._since_prune = 0
            for stack in stacks:
                stack.prune()

    def _refuse(self, caps: Iterable[int], num_tokens: int) -> None:
        record = self.request_hits
        for c in caps:
            r = self.results[c]
            r.refused += 1
            r.refused_tokens += num_tokens
            if record is not None:
                record[c].append(-1)

    def _part(self, stack: SharedStack, take: set[int]) -> SharedStack:
        part = stack.split(take, self.pos)
        self._stacks.append(part)
        self.splits += 1
        return part

    def _step(
        self,
        stack: SharedStack,
        num_tokens: int,
        num_blocks: int,
        num_full: int,
        max_hit: int,
        chain: IntArray,
        olds: IntArray,
    ) -> None:
        """One request on one stack; ``olds``: the first stack's positions of
        the chain's keys before it (the first stack goes first)."""
        top = self.top
        if num_blocks > stack.least:
            refused = {c for c, u in zip(stack.caps, stack.usable, strict=True) if u < num_blocks}
            self._refuse(refused, num_tokens)
            # the refusing stack (never the first: it refuses only what all do)
            # keeps where it had the request's keys
            out = stack if len(refused) == len(stack.caps) else self._part(stack, refused)
            out.regions.append((top, top + num_blocks, top + num_blocks - 1, out.true_olds(olds)))
            if out is stack:
                return
        first = stack.stored is None
        bound = stack.bound
        if first:
            # entries at or above each boundary: a prefix of the chain
            q = (
                olds[::-1].searchsorted([0, *bound]).tolist()
                if num_full
                else [0] * (len(bound) + 1)
            )
            seen = self._seen = num_full - q[0]
            q = q[1:]
            mine = olds
        else:
            mine = stack.true_olds(olds)
            q = mine[::-1].searchsorted(bound).tolist() if num_full else [0] * len(bound)
            seen = self._seen  # what this stack stored is a prefix of that
            stored = stack.stored
            assert stored is not None
            if seen and not stored[chain[seen - 1]]:
                lo, hi = 0, seen - 1
                while lo < hi:
                    mid = (lo + hi) // 2
                    if stored[chain[mid]]:
                        lo = mid + 1
                    else:
                        hi = mid
                seen = lo
        hits = [(h if (h := num_full - x) < max_hit else max_hit) for x in q]
        k_top = max(hits, default=0)
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
                    parts = list(groups.values())
                    if first:  # the largest capacity's group stays in the first stack
                        big = stack.caps[stack.usable.index(max(stack.usable))]
                        parts.sort(key=lambda g: big in g)
                    for group in parts[:-1]:
                        part = self._part(stack, group)
                        self.copy_splits += 1
                        self._step(part, num_tokens, num_blocks, num_full, max_hit, chain, olds)
                    self._step(stack, num_tokens, num_blocks, num_full, max_hit, chain, olds)
                    return
                (idx,) = groups
                chosen[j] = (idx, copies)

        if self.request_hits is not None:
            for c, k in zip(stack.caps, hits, strict=True):
                self.request_hits[c].append(k)

        # --- update G: hits move to the top, the rest are new entries
        if stack.stored is not None and seen < num_full:
            stack.stored[chain[seen:]] = True
        live = stack.live
        if k_top:
            if chosen:
                kills = mine[:k_top].copy()
                for j, (idx, copies) in chosen.items():
                    kills[j] = copies[idx]
                live[kills] = False
            else:
                live[mine[:k_top]] = False
        hi = top + num_blocks - 1  # block j lands at hi - j
        partial = 1 if num_blocks > num_full else 0
        if self._head_uncached:  # the partial block goes to the head: never in G
            live[top + partial : top + num_blocks] = True
            back = partial  # ... and is the next hashless block reused
        else:
            if partial:
                stack.parts.append(top)
            live[top : top + num_blocks] = True
            back = 0
        for j, (idx, copies) in chosen.items():
            copies[idx] = hi - j
        last = num_full - 1
        stored_last = max_hit < num_full and seen == num_full  # the last block was stored
        old_last = int(mine[last]) if stored_last else -1
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

        # --- per capacity: pops from the head (the hashless blocks first:
        # never-used ones, and under uncached_first the freed partial ones)
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
            if e >= x:
                empties[i] = e - x + back
                continue
            empties[i] = back
            x -= e
            b = bound[i]
            c = int(count_nonzero(live[b : b + x]))
            bound[i] = b + x if c == x else advance_boundary(live, b + x, x - c)


def one_pass_curve(
    trace: Trace,
    block_size: int,
    capacities_tokens: Sequence[int | None],
    progress: Callable[[int, int], None] | None = None,
    free_order: FreeOrder = APPEND_ALL,
) -> list[CapacityResult]:
    """Sequence-mode results at every capacity, from one pass (see the module)."""
    curve = OnePassCurve(trace, block_size, capacities_tokens, free_order)
    results = curve.run(progress)
    for r in results:
        r.extra["stacks"] = curve.stacks
    return results
