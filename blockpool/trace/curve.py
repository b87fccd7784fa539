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

_FULL = 2  # live, hashed
_PART = 1  # live, no hash (partial tail block)

IntArray = npt.NDArray[np.int64]
ByteArray = npt.NDArray[np.uint8]


class _Stack:
    """One LRU stack ``G`` shared by a group of capacities (numpy columns:
    the per-request work is a few array operations, not a loop per block)."""

    __slots__ = ("acc", "caps", "extra", "least", "live", "multi", "parts", "pos", "top")

    def __init__(self, caps: list[int], num_keys: int, length: int) -> None:
        self.caps = caps
        self.live: ByteArray = np.zeros(length, dtype=np.uint8)  # 0 dead, 1 unhashed, 2 hashed
        self.pos: IntArray = np.full(num_keys, -1, dtype=np.int64)  # key -> top live copy
        self.multi: ByteArray = np.zeros(num_keys, dtype=np.uint8)  # key -> 1: in ``extra``
        self.extra: dict[int, list[int]] = {}  # key -> copies' positions, first stored first
        self.parts: list[int] = []  # positions of the unhashed entries, rising (never killed)
        self.top = 0
        # admitted, partial tail blocks, cold blocks, stored blocks seen: the same
        # for every capacity of the stack (added to their results at the end)
        self.acc = [0, 0, 0, 0]
        self.least = -1  # the smallest bounded capacity's usable blocks (-1: none)

    def split(self, caps: list[int]) -> _Stack:
        other = _Stack.__new__(_Stack)
        other.caps = caps
        other.live = self.live.copy()
        other.pos = self.pos.copy()
        other.multi = self.multi.copy()
        other.extra = {k: list(v) for k, v in self.extra.items()}
        other.parts = list(self.parts)
        other.top = self.top
        other.acc = list(self.acc)
        gone = set(caps)
        self.caps = [c for c in self.caps if c not in gone]
        return other


def _advance(live: ByteArray, top: int, b: int, x: int) -> int:
    """Skip ``x`` live entries from ``b`` upward: the new boundary."""
    w = 2 * x if x > 32 else 64
    while True:
        end = b + w
        if end > top:
            end = top
        idx = live[b:end].nonzero()[0]
        if len(idx) >= x:
            return b + int(idx[x - 1]) + 1
        if end >= top:
            raise AssertionError("boundary ran past the stack's top")
        x -= len(idx)
        b = end
        w *= 2


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
        n = len(self.results)
        self.bound = [0] * n
        self.empties = [0 if u is None else u for u in self.usable]
        self._stacks: list[_Stack] = []
        self.hit_blocks = [0] * n
        self.last_token = [0] * n
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
            self._stacks = [_Stack(list(range(len(self.results))), num_keys, length)]
            self._least(self._stacks[0])
        for i, req in enumerate(reqs):
            self.step(req.input_length, chains[i])
            if progress is not None and (i & 63 == 63 or i + 1 == total):
                progress(i + 1, total)
        self._count()
        return self.results

    def _least(self, stack: _Stack) -> None:
        bounded = [u for c in stack.caps if (u := self.usable[c]) is not None]
        stack.least = min(bounded) if bounded else -1

    def _count(self) -> None:
        """Each capacity's counts from its stack's and its own sums."""
        bs = self.block_size
        for stack in self._stacks:
            admitted, partial, cold, seen = stack.acc
            for c in stack.caps:
                res = self.results[c]
                k, last = self.hit_blocks[c], self.last_token[c]
                res.admitted = admitted
                res.hit_tokens = k * bs
                evicted = seen - k - last
                reasons = res.miss_reasons
                reasons["last_token"] = last
                reasons["block_size_floor"] = partial
                reasons["evicted"] = evicted
                reasons["cold"] = cold
                res.regret_blocks = evicted

    # ----------------------------------------------------------- one request

    def step(self, num_tokens: int, chain: IntArray) -> None:
        """One request: ``chain``, its full blocks' keys (``BlockKeys.keys``).

        Refusals and evictions are counted at once, the other counts when
        :meth:`run` ends."""
        bs = self.block_size
        num_blocks = -(-num_tokens // bs)
        num_full = len(chain)
        max_hit = min((num_tokens - 1) // bs, num_full)
        for res in self.results:
            res.prompt_tokens += num_tokens
        for stack in list(self._stacks):
            self._step(stack, num_tokens, num_blocks, num_full, max_hit, chain)

    def _refuse(self, caps: list[int], num_tokens: int) -> None:
        for c in caps:
            r = self.results[c]
            r.refused += 1
            r.refused_tokens += num_tokens

    def _step(
        self,
        stack: _Stack,
        num_tokens: int,
        num_blocks: int,
        num_full: int,
        max_hit: int,
        chain: IntArray,
    ) -> None:
        usable, bound = self.usable, self.bound
        if num_blocks > stack.least >= 0:
            refused = [c for c in stack.caps if (u := usable[c]) is not None and u < num_blocks]
            self._refuse(refused, num_tokens)
            if len(refused) == len(stack.caps):
                return
            part = stack.split(refused)
            self._least(part)
            self._least(stack)
            self._stacks.append(part)
            self.splits += 1
        caps = stack.caps
        pos, extra, multi = stack.pos, stack.extra, stack.multi
        olds = pos[chain]  # -1: never stored in this stack
        missing = (olds < 0).nonzero()[0]
        seen = int(missing[0]) if len(missing) else num_full
        lim = min(seen, max_hit)
        if lim:  # positions fall along the chain: a binary search per capacity
            # (an unbounded capacity's boundary stays 0, below every position)
            rising = olds[lim - 1 :: -1]
            hits = (lim - rising.searchsorted([bound[c] for c in caps])).tolist()
            k_top = max(hits)
        else:
            hits = [0] * len(caps)
            k_top = 0
        chosen: dict[int, tuple[int, list[int]]] = {}
        if extra and k_top and multi[chain[:k_top]].any():
            for j in range(k_top):
                copies = extra.get(int(chain[j]))
                if copies is None:
                    continue
                groups: dict[int, list[int]] = {}
                for c, k in zip(caps, hits, strict=True):
                    if k > j:
                        b = -1 if usable[c] is None else bound[c]
                        idx = next(i for i, p in enumerate(copies) if p >= b)
                        groups.setdefault(idx, []).append(c)
                if len(groups) > 1:  # capacities touch different copies: part them
                    for group in list(groups.values())[1:]:
                        part = stack.split(group)
                        self._least(part)
                        self._least(stack)
                        self._stacks.append(part)
                        self.splits += 1
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
            live[t] = _PART
            stack.parts.append(t)
        live[t + partial : t + num_blocks] = _FULL
        if num_full:
            pos[chain] = np.arange(hi, hi - num_full, -1, dtype=np.int64)
        stack.top = t + num_blocks
        for j, (idx, copies) in chosen.items():
            copies[idx] = hi - j
        last = num_full - 1
        old_last = int(olds[last]) if num_full else -1
        dup = (
            max_hit < num_full
            and seen == num_full
            and any(usable[c] is None or old_last >= bound[c] for c in caps)
        )
        if extra and k_top < num_full and multi[chain[k_top:num_full]].any():
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

        # --- per capacity: pops from the head, counts
        acc = stack.acc
        acc[0] += 1
        acc[1] += partial
        acc[2] += num_full - seen
        acc[3] += seen
        hit_blocks, empties = self.hit_blocks, self.empties
        if max_hit < num_full and seen == num_full:  # the last block was stored
            # (an unbounded capacity's boundary stays 0: the block is cached there)
            last_token = self.last_token
            for c in caps:
                if old_last >= bound[c]:
                    last_token[c] += 1
        top = stack.top
        parts = stack.parts
        results = self.results
        for c, k in zip(caps, hits, strict=True):
            hit_blocks[c] += k
            if usable[c] is None:
                continue
            x = num_blocks - k
            e = empties[c]
            if e:
                use = e if e < x else x
                empties[c] = e - use
                x -= use
            if x:  # the hashed entries skipped are evictions; unhashed ones never die
                b0 = bound[c]
                bound[c] = b = _advance(live, top, b0, x)
                results[c].evictions += x - (bisect_left(parts, b) - bisect_left(parts, b0))


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
