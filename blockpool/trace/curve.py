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

from bisect import bisect_right
from collections.abc import Callable, Sequence
from operator import neg

from blockpool.trace.keys import BlockKeys
from blockpool.trace.reader import Trace
from blockpool.trace.results import CapacityResult, capacity_blocks

_FULL = 2  # live, hashed
_PART = 1  # live, no hash (partial tail block)


class _Stack:
    """One LRU stack ``G`` shared by a group of capacities."""

    __slots__ = ("caps", "extra", "live", "multi", "pos", "top")

    def __init__(self, caps: list[int]) -> None:
        self.caps = caps
        self.live = bytearray()  # per position: 0 dead, 1 unhashed, 2 hashed
        self.pos: list[int | None] = []  # key -> highest position of a live copy
        self.multi = bytearray()  # key -> 1 when ``extra`` holds it
        self.extra: dict[int, list[int]] = {}  # key -> copies' positions, first stored first
        self.top = 0

    def grow(self, size: int) -> None:
        if size > len(self.pos):
            more = max(size - len(self.pos), len(self.pos) // 2, 1024)
            self.pos.extend([None] * more)
            self.multi.extend(bytes(more))

    def split(self, caps: list[int]) -> _Stack:
        other = _Stack(caps)
        other.live = bytearray(self.live)
        other.pos = list(self.pos)
        other.multi = bytearray(self.multi)
        other.extra = {k: list(v) for k, v in self.extra.items()}
        other.top = self.top
        gone = set(caps)
        self.caps = [c for c in self.caps if c not in gone]
        return other


def _keys(runs: list[tuple[int, int]]) -> list[int]:
    return [k for a, n in runs for k in range(a, a + n)]


def _any_multi(multi: bytearray, runs: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether a key of blocks ``lo .. hi - 1`` has several copies."""
    j = 0
    for a, n in runs:
        if j >= hi:
            break
        s, e = max(lo - j, 0), min(hi - j, n)
        if s < e and multi.find(1, a + s, a + e) >= 0:
            return True
        j += n
    return False


def _advance(live: bytearray, b: int, x: int) -> tuple[int, int]:
    """Skip ``x`` live entries from ``b`` upward: (new boundary, hashed ones skipped)."""
    start = b
    n = len(live)
    w = max(64, x)
    while x > 0:
        end = min(b + w, n)
        nz = (end - b) - live.count(0, b, end)
        if nz <= x:
            x -= nz
            b = end
            w *= 2
            if b >= n and x:
                raise AssertionError("boundary ran past the stack's top")
            continue
        lo, hi = b, end  # smallest e in (b, end] with x live entries in [b, e)
        while lo < hi:
            mid = (lo + hi) // 2
            if (mid - b) - live.count(0, b, mid) >= x:
                hi = mid
            else:
                lo = mid + 1
        b, x = lo, 0
    return b, live.count(_FULL, start, b)


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
        self._stacks = [_Stack(list(range(n)))] if n else []
        self.splits = 0  # stacks copied (refusals and copies)
        self.copy_splits = 0  # of which: capacities touching different copies

    @property
    def stacks(self) -> int:
        return len(self._stacks)

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[CapacityResult]:
        reqs = self.trace.requests
        total = len(reqs)
        for i, req in enumerate(reqs):
            self.step(req.input_length, self.keys.runs(req))
            if progress is not None and (i & 63 == 63 or i + 1 == total):
                progress(i + 1, total)
        return self.results

    # ----------------------------------------------------------- one request

    def step(self, num_tokens: int, runs: list[tuple[int, int]]) -> None:
        """One request: ``runs`` of its full blocks' keys (``BlockKeys.runs``)."""
        bs = self.block_size
        num_blocks = -(-num_tokens // bs)
        num_full = sum(n for _, n in runs)
        max_hit = min((num_tokens - 1) // bs, num_full)
        for res in self.results:
            res.prompt_tokens += num_tokens
        for stack in list(self._stacks):
            self._step(stack, num_tokens, num_blocks, num_full, max_hit, runs)

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
        runs: list[tuple[int, int]],
    ) -> None:
        usable, bound = self.usable, self.bound
        refused = [c for c in stack.caps if (u := usable[c]) is not None and u < num_blocks]
        if refused:
            self._refuse(refused, num_tokens)
            if len(refused) == len(stack.caps):
                return
            self._stacks.append(stack.split(refused))
            self.splits += 1
        caps = stack.caps
        if runs:
            stack.grow(max(a + n for a, n in runs))
        pos, extra, multi = stack.pos, stack.extra, stack.multi
        olds: list[int | None] = []
        for a, n in runs:
            olds += pos[a : a + n]
        try:
            seen = olds.index(None)
        except ValueError:
            seen = num_full
        lim = min(seen, max_hit)
        hits = []
        for c in caps:
            if usable[c] is None:
                hits.append(lim)
            else:  # positions fall along the chain: binary search
                hits.append(bisect_right(olds, -bound[c], 0, lim, key=neg))  # type: ignore[arg-type]
        k_top = max(hits)
        chosen: dict[int, tuple[int, list[int]]] = {}
        keys: list[int] | None = None
        if extra and k_top and _any_multi(multi, runs, 0, k_top):
            keys = _keys(runs)
            for j in range(k_top):
                copies = extra.get(keys[j])
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
                        self._stacks.append(part)
                        self.splits += 1
                        self.copy_splits += 1
                        self._step(part, num_tokens, num_blocks, num_full, max_hit, runs)
                    self._step(stack, num_tokens, num_blocks, num_full, max_hit, runs)
                    return
                (idx,) = groups
                chosen[j] = (idx, copies)

        # --- update G: hits move to the top, the rest are new entries
        live = stack.live
        kills = olds[:k_top]
        for j, (idx, copies) in chosen.items():
            kills[j] = copies[idx]
        for p in kills:
            live[p] = 0  # type: ignore[index]
        t = stack.top
        hi = t + num_blocks - 1  # block j lands at hi - j
        if num_blocks > num_full:
            live.append(_PART)
        live.extend(b"\x02" * num_full)
        j = 0
        for a, n in runs:
            p0 = hi - j
            pos[a : a + n] = range(p0, p0 - n, -1)
            j += n
        stack.top = t + num_blocks
        for j, (idx, copies) in chosen.items():
            copies[idx] = hi - j
        last = num_full - 1
        dup = (
            max_hit < num_full
            and seen == num_full
            and any(usable[c] is None or olds[last] >= bound[c] for c in caps)  # type: ignore[operator]
        )
        if extra and k_top < num_full and _any_multi(multi, runs, k_top, num_full):
            keys = _keys(runs) if keys is None else keys
            for j in range(k_top, num_full - 1 if dup else num_full):
                if extra.pop(keys[j], None) is not None:
                    multi[keys[j]] = 0
        if dup:  # the last block is stored again while a copy is cached
            key = runs[-1][0] + runs[-1][1] - 1
            copies = extra.get(key)
            if copies is None:
                extra[key] = [olds[last], hi - last]  # type: ignore[list-item]
                multi[key] = 1
            else:
                copies.append(hi - last)

        # --- per capacity: pops from the head, counts
        bs = self.block_size
        partial = 1 if num_blocks > num_full else 0
        for c, k in zip(caps, hits, strict=True):
            res = self.results[c]
            res.admitted += 1
            res.hit_tokens += k * bs
            last_token = (
                1
                if max_hit < num_full
                and seen == num_full
                and (usable[c] is None or olds[last] >= bound[c])  # type: ignore[operator]
                else 0
            )
            evicted = seen - k - last_token
            reasons = res.miss_reasons
            reasons["last_token"] += last_token
            reasons["block_size_floor"] += partial
            reasons["evicted"] += evicted
            reasons["cold"] += num_full - seen
            res.regret_blocks += evicted
            if usable[c] is None:
                continue
            x = num_blocks - k
            e = self.empties[c]
            if e:
                use = e if e < x else x
                self.empties[c] = e - use
                x -= use
            if x:
                bound[c], ev = _advance(live, bound[c], x)
                res.evictions += ev


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
