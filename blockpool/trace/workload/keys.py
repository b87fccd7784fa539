"""Block identities without hashing, and the real block hashes.

Two full blocks have the same chained hash exactly when their whole token
prefixes are equal (no hash collisions assumed).  :class:`BlockKeys` gives
each distinct prefix a small int: a trie over the prompt's hash ids (a
Mooncake trace) or over its blocks' token tuples (a recording), rooted at
the request's extra keys (LoRA name, cache salt).  The one-pass curve works
on these ints; pool replays use :func:`block_hashes` (the real hashes).
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import numpy.typing as npt

from blockpool.core.block_hasher import get_request_block_hasher
from blockpool.core.hashing import BlockHash, HashFn
from blockpool.core.request import LoRARequest, Request
from blockpool.trace.workload.reader import Trace, TraceRequest


class BlockKeys:
    """Ints standing for full blocks' prefixes (equal ints, equal hashes)."""

    def __init__(self, trace: Trace, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be positive, got {block_size}")
        self.trace = trace
        self.block_size = block_size
        self._roots: dict[tuple[str | None, str | None], int] = {}
        self._nodes: dict[tuple[int, int], int] = {}
        self._blocks: dict[tuple[int, tuple[int, ...]], int] = {}

    def _root(self, req: TraceRequest) -> int:
        tag = (req.lora_name, req.cache_salt)
        root = self._roots.get(tag)
        if root is None:
            root = self._roots[tag] = -1 - len(self._roots)
        return root

    def _id_nodes(self, req: TraceRequest) -> list[int]:
        """The trie nodes of a Mooncake request's hash ids, one per id."""
        nodes_map = self._nodes
        parent = self._root(req)
        nodes: list[int] = []
        for h in req.hash_ids:
            node = nodes_map.get((parent, h))
            if node is None:
                node = nodes_map[(parent, h)] = len(nodes_map)
            nodes.append(node)
            parent = node
        return nodes

    def keys(self, req: TraceRequest) -> list[int]:
        """One int per full prompt block, in order."""
        bs = self.block_size
        num_full = req.input_length // bs
        if req.token_ids is not None:
            return self._token_keys(req, num_full)
        nodes = self._id_nodes(req)
        tpi = self.trace.tokens_per_id
        if tpi % bs == 0:
            runs = self._node_runs(nodes, num_full)
            return list(chain.from_iterable(range(a, a + n) for a, n in runs))
        # a block may straddle two ids: name it by the id holding its last token
        return [
            nodes[((j + 1) * bs - 1) // tpi] * tpi + ((j + 1) * bs - 1) % tpi
            for j in range(num_full)
        ]

    def runs(self, req: TraceRequest) -> list[tuple[int, int]]:
        """The keys of :meth:`keys` as runs ``(first key, count)`` of consecutive ints."""
        bs = self.block_size
        tpi = self.trace.tokens_per_id
        if req.token_ids is None and tpi % bs == 0:
            nodes = self._id_nodes(req)
            return self._node_runs(nodes, req.input_length // bs)
        out: list[tuple[int, int]] = []
        for k in self.keys(req):
            if out and out[-1][0] + out[-1][1] == k:
                out[-1] = (out[-1][0], out[-1][1] + 1)
            else:
                out.append((k, 1))
        return out

    def chain(self, req: TraceRequest) -> npt.NDArray[np.int64]:
        """The keys of :meth:`keys` as one numpy array."""
        bs = self.block_size
        tpi = self.trace.tokens_per_id
        if req.token_ids is None and tpi % bs == 0:
            nodes = self._id_nodes(req)
            per = tpi // bs
            grid = np.asarray(nodes, dtype=np.int64)[:, None] * per + np.arange(per)
            return grid.ravel()[: req.input_length // bs]
        return np.asarray(self.keys(req), dtype=np.int64)

    def _node_runs(self, nodes: list[int], num_full: int) -> list[tuple[int, int]]:
        per = self.trace.tokens_per_id // self.block_size
        out: list[tuple[int, int]] = []
        left = num_full
        for n in nodes:
            if left <= 0:
                break
            c = per if per < left else left
            a = n * per
            if out and out[-1][0] + out[-1][1] == a:
                out[-1] = (out[-1][0], out[-1][1] + c)
            else:
                out.append((a, c))
            left -= c
        return out

    def _token_keys(self, req: TraceRequest, num_full: int) -> list[int]:
        assert req.token_ids is not None
        bs = self.block_size
        toks = req.token_ids
        blocks = self._blocks
        parent = self._root(req)
        out: list[int] = []
        for j in range(num_full):
            k = (parent, toks[j * bs : j * bs + bs])
            key = blocks.get(k)
            if key is None:
                key = blocks[k] = len(blocks)
            out.append(key)
            parent = key
        return out


def trace_chains(trace: Trace, block_size: int) -> list[npt.NDArray[np.int64]]:
    """Every request's block keys, as :meth:`BlockKeys.chain` gives them, in bulk.

    Equal ints stand for equal prefixes here too, but the ints are numbered
    apart from any :class:`BlockKeys` (do not mix the two).  For a Mooncake
    trace whose ``tokens_per_id`` is a multiple of the block size the trie is
    built level by level with numpy: at depth ``d`` every request's node is
    the pair (its node at ``d - 1``, its ``d``-th hash id), and the distinct
    pairs of one level are numbered by one ``np.unique``.  Otherwise, request
    by request through :class:`BlockKeys`.
    """
    if block_size < 1:
        raise ValueError(f"block size must be positive, got {block_size}")
    reqs = trace.requests
    tpi = trace.tokens_per_id
    if tpi % block_size or any(r.token_ids is not None for r in reqs):
        keys = BlockKeys(trace, block_size)
        return [keys.chain(r) for r in reqs]
    n = len(reqs)
    if n == 0:
        return []
    per = tpi // block_size
    tags: dict[tuple[str | None, str | None], int] = {}
    roots = np.fromiter(
        (tags.setdefault((r.lora_name, r.cache_salt), len(tags)) for r in reqs), np.int64, n
    )
    lens = np.fromiter((len(r.hash_ids) for r in reqs), np.int64, n)
    total = int(lens.sum())
    flat = np.fromiter(chain.from_iterable(r.hash_ids for r in reqs), np.int64, total)
    ids, dense = np.unique(flat, return_inverse=True)
    width = len(ids)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    depth = np.arange(total, dtype=np.int64) - np.repeat(starts[:-1], lens)
    order = np.argsort(depth, kind="stable")  # level by level, requests in order
    level_ends = np.cumsum(np.bincount(depth, minlength=int(lens.max())))
    owner = np.repeat(np.arange(n, dtype=np.int64), lens)[order]
    h = dense.reshape(-1)[order]
    cur = roots  # each request's node so far: its root first (numbered below 0 .. len(tags))
    base = len(tags)
    nodes_sorted = np.empty(total, dtype=np.int64)
    lo = 0
    for hi in level_ends.tolist():
        who = owner[lo:hi]
        pair = cur[who] * width + h[lo:hi]
        uniq, inv = np.unique(pair, return_inverse=True)
        got = base + inv.reshape(-1)
        nodes_sorted[lo:hi] = got
        cur[who] = got
        base += len(uniq)
        lo = hi
    nodes = np.empty(total, dtype=np.int64)
    nodes[order] = nodes_sorted
    blocks = (nodes[:, None] * per + np.arange(per, dtype=np.int64)).ravel()
    out = []
    for i, r in enumerate(reqs):
        a = int(starts[i]) * per
        out.append(blocks[a : a + r.input_length // block_size])
    return out


def make_request(trace: Trace, req: TraceRequest, request_id: str, hasher: object) -> Request:
    """A blockpool Request for ``req``'s prompt, hashed by ``hasher``."""
    lora = LoRARequest(req.lora_name) if req.lora_name else None
    return Request(
        request_id,
        trace.prompt_token_ids(req),
        block_hasher=hasher,  # type: ignore[arg-type]
        lora_request=lora,
        cache_salt=req.cache_salt,
    )


def block_hashes(
    trace: Trace, req: TraceRequest, block_size: int, hash_fn: HashFn
) -> tuple[Request, list[BlockHash]]:
    """The request (prompt tokens) and the real hashes of its full blocks."""
    hasher = get_request_block_hasher(block_size, hash_fn)
    r = make_request(trace, req, str(req.index), hasher)
    return r, r.block_hashes
