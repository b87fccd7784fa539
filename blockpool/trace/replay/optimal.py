"""The most hit tokens any eviction policy could get: an offline optimum.

The model (sequence mode, as ``curve.py`` and ``sequence.py`` replay it).  A
pool has ``M`` usable blocks.  Request ``t`` has ``P_t`` blocks, full blocks
``c_1 .. c_F`` (a prefix chain: ``c_j`` names the whole prefix up to block
``j``, so a key sits at the same depth ``j`` in every chain holding it) and
may hit at most ``h_t = min((n - 1) // bs, F)`` blocks.  A request with
``P_t > M`` is refused and touches nothing (as in the pool: same refusals
for every policy).  Otherwise its hits are the longest ``c_1 .. c_k``
(``k <= h_t``) all cached; it holds ``P_t`` blocks (its hits and ``P_t - k``
reused free blocks), so at most ``M - P_t`` other cached contents survive
it; afterwards its full blocks are cached.  A *policy* is any choice of which
free blocks to reuse: vLLM's LRU queue, uncached-first, S3-FIFO, or one that
knows the future.  Blocks in use cannot be evicted: that is the ``M - P_t``.

The algorithm: Belady's MIN on this stream.  After request ``t`` each of its
full blocks ``c_j`` gets the priority ``(u, j)``, ``u`` the next request
(not refused) whose chain holds ``c_j``, when ``j < h_u`` there (a *counted*
reference); a block whose next reference is not counted (it holds the last
prompt token there, or there is none) is worth nothing and is dropped at
once.  At each request the cached blocks scheduled for it are its hits; then
the rest is cut to ``M - P_t`` by evicting the largest priorities (furthest
next use, deepest first).

Why it is exact (an upper bound on every policy, and reached by one).

1. *Prefix closure.*  A reference to ``c_j`` (``j >= 2``) is a reference to
   ``c_{j-1}`` at the same request, and counted there when ``c_j``'s is, so
   the blocks scheduled for request ``u`` are depths ``0 .. s-1`` of its chain
   (cold keys have only cold descendants).  Among blocks scheduled for the
   same ``u``, eviction takes the deepest first, so the survivors for ``u``
   are again ``0 .. k-1``: every cached counted block is part of the hit
   prefix, and the number of scheduled survivors *is* the prefix hit count.
2. *Relaxation.*  Count, for any policy, its *block hits*: counted
   references whose block is cached, contiguous or not.  Block hits >= prefix
   hits for every policy, and by (1) MIN's block hits equal its prefix hits.
3. *MIN maximises block hits* under per-request budgets ``M - P_t`` (the
   exchange argument of Belady 1966 / Mattson et al. 1970, which never uses
   a constant budget): take an optimal schedule that first differs from MIN
   at request ``t``, keeping ``b`` where MIN keeps ``a``, ``(u_a, j_a) <
   (u_b, j_b)``.  Keep ``a`` in ``b``'s place until ``u_a`` or until the
   schedule drops ``b`` (neither is referenced before ``u_a``, so every
   budget still holds).  If ``b`` is dropped first, both schedules drop their
   block and agree from then on: no loss.  Otherwise the new schedule gains
   ``a``'s hit at ``u_a`` and can lose at most ``b``'s at ``u_b`` (a block
   never comes back except by being referenced, when it is loaded for
   every schedule alike).  An uncounted or absent next reference is worth
   nothing, so dropping such a block first never loses.  Induction on ``t``
   turns the optimal schedule into MIN's.
4. *Realisable.*  MIN only chooses which free blocks to reuse, so it is a
   policy of the model: its hits are reached, and with (2) and (3) no policy
   (LRU included) gets more.  Unbounded (``M = inf``) caches everything ever
   stored, so LRU <= optimal <= unbounded at every capacity.

Cost: blocks are handled in segments (consecutive depths with the same next
use), so one capacity is a heap over a few segments per request.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from blockpool.trace.workload.keys import BlockKeys
from blockpool.trace.workload.reader import Trace

_NEVER = np.iinfo(np.int64).max

IntArray = npt.NDArray[np.int64]


class OptimalCurve:
    """Offline-optimal hit tokens of a sequence replay, capacity by capacity."""

    def __init__(self, trace: Trace, block_size: int, keys: BlockKeys | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be positive, got {block_size}")
        self.block_size = block_size
        bk = keys if keys is not None else BlockKeys(trace, block_size)
        n_req = len(trace.requests)
        self.num_blocks = np.empty(n_req, dtype=np.int64)
        self.max_hit = np.empty(n_req, dtype=np.int64)
        chains: list[IntArray] = []
        for i, req in enumerate(trace.requests):
            n = req.input_length
            chain = bk.chain(req)
            self.num_blocks[i] = -(-n // block_size)
            self.max_hit[i] = min((n - 1) // block_size, len(chain))
            chains.append(chain)
        refs = sum(len(c) for c in chains)
        top = max((int(c.max()) for c in chains if len(c)), default=-1)
        if top > 2 * refs + 16:  # sparse names (blocks straddling ids): make them dense
            flat = np.concatenate(chains)
            _, inv = np.unique(flat, return_inverse=True)
            dense: list[IntArray] = []
            pos = 0
            for ch in chains:
                dense.append(inv[pos : pos + len(ch)].astype(np.int64))
                pos += len(ch)
            chains = dense
            top = int(inv.max()) if len(inv) else -1
        self.chains = chains
        self.num_keys = top + 1
        self._segments: dict[int, list[list[tuple[int, int, int]]]] = {}

    def _segments_for(self, limit: int | None) -> list[list[tuple[int, int, int]]]:
        """Per request: ``(next use, first depth, count)`` of its blocks worth keeping,
        with the requests over ``limit`` blocks refused (None: none)."""
        nb = self.num_blocks
        refused = 0 if limit is None else int(np.count_nonzero(nb > limit))
        memo = self._segments.get(refused)
        if memo is not None:
            return memo
        n_req = len(self.chains)
        nxt = np.full(self.num_keys, _NEVER, dtype=np.int64)
        hm = np.append(self.max_hit, 0)
        out: list[list[tuple[int, int, int]]] = [[] for _ in range(n_req)]
        for t in range(n_req - 1, -1, -1):
            if limit is not None and nb[t] > limit:
                continue
            chain = self.chains[t]
            f = len(chain)
            if not f:
                continue
            nt = nxt[chain]
            nxt[chain] = t
            depth = np.arange(f, dtype=np.int64)
            valid = (nt != _NEVER) & (depth < hm[np.minimum(nt, n_req)])
            if not valid.any():
                continue
            cut = np.flatnonzero((nt[1:] != nt[:-1]) | (valid[1:] != valid[:-1])) + 1
            starts = np.concatenate(([0], cut))
            ends = np.concatenate((cut, [f]))
            keep = valid[starts]
            out[t] = [
                (int(u), int(s), int(e - s))
                for u, s, e in zip(nt[starts][keep], starts[keep], ends[keep], strict=True)
            ]
        self._segments[refused] = out
        return out

    def hit_blocks(self, usable_blocks: int | None) -> int:
        """Optimal hit blocks over the trace with ``usable_blocks`` (None: unbounded)."""
        segs = self._segments_for(usable_blocks)
        nb = self.num_blocks
        heap: list[tuple[int, int, int]] = []
        push, pop = heapq.heappush, heapq.heappop
        count: list[int] = []
        sched: dict[int, list[int]] = {}
        total = hits = 0
        for t, mine in enumerate(segs):
            if usable_blocks is not None and nb[t] > usable_blocks:
                continue
            due = sched.pop(t, None)
            if due:
                for sid in due:
                    c = count[sid]
                    hits += c
                    total -= c
                    count[sid] = 0
            if usable_blocks is not None:
                excess = total - (usable_blocks - int(nb[t]))
                while excess > 0:
                    sid = heap[0][2]
                    c = count[sid]
                    if c <= excess:
                        pop(heap)
                        count[sid] = 0
                        total -= c
                        excess -= c
                    else:
                        count[sid] = c - excess
                        total -= excess
                        excess = 0
            for u, j0, c in mine:
                sid = len(count)
                count.append(c)
                if usable_blocks is not None:
                    push(heap, (-u, -j0, sid))
                lst = sched.get(u)
                if lst is None:
                    sched[u] = [sid]
                else:
                    lst.append(sid)
                total += c
            if usable_blocks is not None and len(heap) > 4 * total + 4096:
                heap = [e for e in heap if count[e[2]]]
                heapq.heapify(heap)
        return hits

    def hit_tokens(
        self,
        usable_blocks: Sequence[int | None],
        progress: Callable[[int, int], None] | None = None,
    ) -> list[int]:
        out = []
        for i, m in enumerate(usable_blocks):
            out.append(self.hit_blocks(m) * self.block_size)
            if progress is not None:
                progress(i + 1, len(usable_blocks))
        return out
