"""RequestManager: a request's life above the pool (docs/spec.md §8).

admit: hash the full blocks -> walk the hashes from the left, one lookup per
block across every KV-cache group (a block hits only if every group holds
it), stop at the first miss and never count the block holding the last
prompt token -> touch the hits -> allocate the rest (refused, changing
nothing, when too few are free) -> cache the newly full blocks.
append_tokens: decode tokens, allocating and caching as blocks fill.
finish: free each group's blocks in reverse, so the chain's tail is evicted
first and the shared prefix lives longest.

As in vLLM, the manager has a coordinator which has the pool: the walk, the
block tables, allocation, caching and freeing are the
:class:`~blockpool.core.coordinator.KVCacheCoordinator`'s (one
full-attention group per group id); the manager keeps what is a request's:
its ids and life cycle, its hashes, the typed errors and the prefix-cache
statistics.

All groups share one block size, a multiple of the pool's hash block size
(coarse hashes are the concatenation of fine ones, docs/spec.md §1).
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from blockpool.core.attention import FULL_ATTENTION, GroupSpec
from blockpool.core.block import KVCacheBlock
from blockpool.core.block_hasher import HashableRequest, get_request_block_hasher, need_extra_keys
from blockpool.core.coordinator import KVCacheCoordinator
from blockpool.core.errors import (
    DuplicateRequestError,
    NotEnoughBlocksError,
    RequestFinishedError,
    UnknownRequestError,
)
from blockpool.core.hashing import (
    BlockHash,
    BlockHashList,
    BlockHashListWithBlockSize,
    HashFn,
    get_none_hash,
    sha256,
)
from blockpool.core.pool import BlockPool
from blockpool.core.request import LoRARequest, Request

_FINISHED_MEMORY = 10_000  # finished ids remembered to tell "double finish" apart


def _request_block_hasher(
    block_size: int, hash_fn: HashFn
) -> Callable[[HashableRequest], list[BlockHash]]:
    """``get_request_block_hasher``'s hasher (the same hashes), with a fast
    path for requests without extra keys: no new full block returns at once
    (a decode step), and the chain is hashed in one loop (sha256 inlined)."""
    generic = get_request_block_hasher(block_size, hash_fn)
    dumps, proto, new_sha = pickle.dumps, pickle.HIGHEST_PROTOCOL, hashlib.sha256
    inline = hash_fn is sha256

    def hasher(request: HashableRequest) -> list[BlockHash]:
        hashes = request.block_hashes
        start = len(hashes) * block_size
        tokens = request.all_token_ids
        end = len(tokens) - block_size
        if start > end:
            return []
        if request.prompt_embeds is not None or need_extra_keys(request):
            return generic(request)
        parent: bytes = (hashes[-1] if hashes else None) or get_none_hash()
        out: list[bytes] = []
        put = out.append
        if inline:
            for s in range(start, end + 1, block_size):
                block = dumps((parent, tuple(tokens[s : s + block_size]), None), proto)
                parent = new_sha(block).digest()
                put(parent)
        else:
            for s in range(start, end + 1, block_size):
                parent = hash_fn((parent, tuple(tokens[s : s + block_size]), None))
                put(parent)
        return out  # type: ignore[return-value]

    return hasher


@dataclass
class PrefixCacheStats:
    """Prefix-cache statistics in tokens, per admitted request (vLLM's)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class ManagedRequest:
    """A running request: its tokens, hashes and one block table per group
    (the coordinator's own lists, which stay readable after finish)."""

    request: Request
    block_tables: list[list[KVCacheBlock]]
    num_cached_blocks: int
    num_hit_blocks: int
    block_hashes: BlockHashList = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return self.request.num_tokens

    def block_ids(self) -> list[list[int]]:
        return [[b.block_id for b in table] for table in self.block_tables]


@dataclass(frozen=True)
class Admission:
    """What admit did: block ids per group, and how many came from the cache."""

    request_id: str
    block_ids: list[list[int]]
    num_hit_blocks: int
    num_computed_tokens: int
    num_new_blocks: int


class RequestManager:
    """Runs requests against one BlockPool with one or more KV-cache groups."""

    def __init__(
        self,
        pool: BlockPool,
        block_size: int | None = None,
        *,
        group_ids: Sequence[int] = (0,),
        hash_fn: HashFn = sha256,
    ) -> None:
        self.pool = pool
        self.block_size = pool.hash_block_size if block_size is None else block_size
        if self.block_size <= 0 or self.block_size % pool.hash_block_size:
            raise ValueError(
                f"block size {self.block_size} must be a positive multiple of the "
                f"pool's hash block size {pool.hash_block_size}"
            )
        if not group_ids or len(set(group_ids)) != len(group_ids):
            raise ValueError(f"group ids must be distinct and non-empty, got {list(group_ids)}")
        self.group_ids = list(group_ids)
        self.hash_fn = hash_fn
        self._hasher = _request_block_hasher(pool.hash_block_size, hash_fn)
        spec = GroupSpec(FULL_ATTENTION, self.block_size)
        self.coordinator = KVCacheCoordinator(
            pool,
            [spec] * len(self.group_ids),
            sys.maxsize,  # no model length: a request grows as long as blocks last
            pool.hash_block_size,
            group_ids=self.group_ids,
        )
        self.requests: dict[str, ManagedRequest] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.stats = PrefixCacheStats()

    # ------------------------------------------------------------------ helpers

    def make_request(
        self,
        request_id: str,
        token_ids: Iterable[int],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        lora_id: int = 1,
    ) -> Request:
        lora = LoRARequest(lora_name, lora_id) if lora_name else None
        return Request(
            request_id,
            token_ids,
            block_hasher=self._hasher,
            lora_request=lora,
            cache_salt=cache_salt,
        )

    def _view(self, request: Request) -> BlockHashList:
        if self.block_size == self.pool.hash_block_size:
            return request.block_hashes
        return BlockHashListWithBlockSize(
            request.block_hashes, self.pool.hash_block_size, self.block_size
        )

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], num_tokens: int
    ) -> list[list[KVCacheBlock]]:
        """Per group, the cached blocks of the longest hit prefix of a request
        of ``num_tokens`` tokens with these block hashes (a request's own, at
        the pool's hash block size); the block holding the last token is never
        a hit."""
        if not self.pool.enable_caching:
            return [[] for _ in self.group_ids]
        return list(self.coordinator.find_longest_cache_hit(block_hashes, num_tokens - 1)[0])

    def lookup(
        self,
        token_ids: Sequence[int],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """How many leading tokens of this prompt would hit now (changes nothing)."""
        req = self.make_request("", token_ids, lora_name=lora_name, cache_salt=cache_salt)
        return len(self.find_longest_cache_hit(req.block_hashes, len(token_ids))[0]) * (
            self.block_size
        )

    def _get(self, request_id: str) -> ManagedRequest:
        managed = self.requests.get(request_id)
        if managed is None:
            if request_id in self._finished:
                raise RequestFinishedError(f"request {request_id!r} was already finished")
            raise UnknownRequestError(f"no running request {request_id!r}")
        return managed

    def _refuse(self, needed: int, what: str) -> NoReturn:
        free = self.pool.get_num_free_blocks()
        raise NotEnoughBlocksError(
            f"{what} needs {needed} free block(s) but only {free} are free",
            requested=needed,
            free=free,
        )

    # -------------------------------------------------------------- lifecycle

    def admit(
        self,
        request_id: str,
        token_ids: Sequence[int],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        lora_id: int = 1,
    ) -> Admission:
        """Start a request: reuse its cached prefix, allocate the rest, cache
        its full blocks.  NotEnoughBlocksError (nothing changed) when the
        pool cannot hold it.  ``lora_id`` is the adapter's int id that
        BlockStored events carry (vLLM's ``lora_int_id``); only the name
        enters the hashes."""
        if request_id in self.requests:
            raise DuplicateRequestError(f"request {request_id!r} is already running")
        if len(token_ids) == 0:
            raise ValueError("a request needs at least one token")
        req = self.make_request(
            request_id, token_ids, lora_name=lora_name, cache_salt=cache_salt, lora_id=lora_id
        )
        num_tokens = req.num_tokens
        hits = tuple(self.find_longest_cache_hit(req.block_hashes, num_tokens))
        num_hit = len(hits[0])
        hit_tokens = num_hit * self.block_size
        co = self.coordinator
        new = co.allocate_slots(
            req,
            num_tokens - hit_tokens,
            hit_tokens,
            hits,
            num_computed_tokens=0,
            num_tokens=num_tokens,
            cache=self.pool.enable_caching,
        )
        if new is None:
            needed = co.get_num_blocks_to_allocate(request_id, num_tokens, hits, hit_tokens)
            self._refuse(needed, "admitting the request")
        num_full = num_tokens // self.block_size
        managed = ManagedRequest(
            req, co.tables_of(request_id), max(num_full, num_hit), num_hit, self._view(req)
        )
        self.requests[request_id] = managed
        self._finished.pop(request_id, None)
        self.stats.requests += 1
        self.stats.queries += num_tokens
        self.stats.hits += hit_tokens
        return Admission(
            request_id, managed.block_ids(), num_hit, hit_tokens, sum(len(b) for b in new)
        )

    def append_tokens(self, request_id: str, token_ids: Sequence[int]) -> list[list[int]]:
        """Append decode tokens; returns the ids of blocks allocated per group.
        NotEnoughBlocksError (nothing changed) when the pool cannot grow it."""
        managed = self.requests.get(request_id)
        if managed is None:
            managed = self._get(request_id)  # raises the right error
        req = managed.request
        num_computed = len(req.all_token_ids)
        new_total = num_computed + len(token_ids)
        co = self.coordinator
        need = co.get_num_blocks_to_allocate(request_id, new_total, None, num_computed)
        added: list[list[int]]
        if need:
            if need > self.pool.get_num_free_blocks():
                self._refuse(need, "appending the tokens")
            req.append_output_token_ids(token_ids)
            new = co.allocate_slots(
                req, len(token_ids), num_computed_tokens=num_computed, cache=False
            )
            assert new is not None, "counted above"
            added = [[b.block_id for b in blocks] for blocks in new]
        else:  # a decode step inside the last block: the common case
            req.append_output_token_ids(token_ids)
            added = [[]] if len(self.group_ids) == 1 else [[] for _ in self.group_ids]
        num_full = new_total // self.block_size
        if num_full > managed.num_cached_blocks and self.pool.enable_caching:
            co.cache_blocks(req, new_total)
            managed.num_cached_blocks = num_full
        return added

    def finish(self, request_id: str) -> list[list[int]]:
        """Free the request's blocks (each group's in reverse); returns the ids
        freed per group, in the order they were freed."""
        managed = self._get(request_id)
        freed = [[b.block_id for b in reversed(table)] for table in managed.block_tables]
        self.coordinator.free(request_id)
        del self.requests[request_id]
        self._finished[request_id] = None
        if len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)
        return freed

    def restore(
        self,
        running: Iterable[tuple[Request, list[list[KVCacheBlock]], int, int]],
        finished: Iterable[str],
        stats: PrefixCacheStats,
    ) -> None:
        """Replace every request by ``running`` (request, block tables,
        cached blocks, hit blocks), as a snapshot of the pool restores them:
        the pool's ref counts are written with it, so nothing is touched or
        freed here.  The requests hash their next tokens with this manager's
        hasher."""
        co = self.coordinator
        co.forget_all()
        self.requests = {}
        for req, tables, num_cached, num_hit in running:
            req._block_hasher = self._hasher
            co.adopt(req.request_id, tables, num_cached)
            self.requests[req.request_id] = ManagedRequest(
                req, tables, num_cached, num_hit, self._view(req)
            )
        self._finished = OrderedDict.fromkeys(finished)
        self.stats = stats

    def get(self, request_id: str) -> ManagedRequest:
        return self._get(request_id)

    def block_hashes_of(self, request_id: str) -> list[BlockHash]:
        return list(self._get(request_id).block_hashes)
