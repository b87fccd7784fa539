"""The scheduler's KV slots as a PoolRuntime's operations (the live replay).

The calls of :class:`~blockpool.trace.sched.slots.KVSlots`, made as runtime
operations through the ``apply`` the caller gives (the service's engine, so
that its observers, stream and analysis see each change):

- ``lookup``: the cached prefix of the request's tokens so far (never the
  block of its last token), as one lookup of them all finds it, hashing
  little more than it: a prefix's hits are the whole's up to the prefix's
  cap, so prefixes twice as long each time are looked up until one misses
  before its cap.  Counted per lookup as ``KVSlots`` counts them;
- ``allocate`` of a waiting request: ``admit`` of its first ``num_hit +
  num_new`` tokens (the admission finds the prefix the lookup found; its
  full blocks are cached); of a running one: ``append`` of the tokens from
  those it holds up to ``num_computed + num_new``.  ``False`` (nothing
  changed) when the pool lacks the blocks; any other refusal of an
  admission is noted in ``refused`` (the driver drops the request), of an
  append (another client finished the request) in ``lost`` (the driver
  puts it back in the queue);
- ``free``: ``finish`` (its blocks freed, last first).

Synchronous scheduling only: a slot is taken for a known token (the runtime
appends tokens, it has no placeholders), so ``cache_blocks`` is never asked.
The service's analysis classifies every admission's misses, so these slots
count none (``counts_misses``).  Tokens are built only for the chunk at hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from blockpool.core.block import KVCacheBlock
from blockpool.core.hashing import BlockHash
from blockpool.core.manager import RequestManager
from blockpool.runtime.errors import NotEnoughBlocks, OperationError
from blockpool.runtime.ops import AdmitOp, AppendOp, FinishOp, Op
from blockpool.trace.sched.sched_request import SchedRequest
from blockpool.trace.sched.slots import LookupStats, MissArgs, SlotRequest
from blockpool.trace.workload.reader import Trace, TraceRequest


class LiveTokens:
    """A trace request's token counts in the scheduler; its tokens are
    built from the trace a chunk at a time (:meth:`RuntimeSlots.tokens`)."""

    __slots__ = ("num_prompt_tokens", "num_tokens", "request", "request_id")

    def __init__(self, request_id: str, request: TraceRequest) -> None:
        self.request_id = request_id
        self.request = request
        self.num_prompt_tokens = request.input_length
        self.num_tokens = request.input_length

    @property
    def block_hashes(self) -> list[BlockHash]:
        return []  # the runtime hashes the tokens it is given

    def append_output_token_ids(self, token_ids: int) -> None:  # noqa: ARG002 vLLM's request/manager interface
        self.num_tokens += 1


class TraceOutputs(Sequence[int]):
    """A trace request's output tokens, built one at a time when read."""

    def __init__(self, trace: Trace, request: TraceRequest, n: int) -> None:
        self.trace = trace
        self.request = request
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not 0 <= i < self.n:
            raise IndexError(i)
        out = self.trace.output_token_ids(self.request, i, i + 1)
        return out[0] if out else 0


def live_request(trace: Trace, tr: TraceRequest, rid: str, arrival_ms: float) -> SchedRequest:
    """The scheduler's request for ``tr`` (at least one output token)."""
    n = max(tr.output_length, 1)
    tokens = LiveTokens(rid, tr)
    return SchedRequest(tokens, TraceOutputs(trace, tr, n), n, arrival_ms, tr.priority, tr.index)


class RuntimeSlots:
    """The requests' slots as runtime operations through ``apply``."""

    counts_misses = False

    def __init__(
        self, trace: Trace, apply: Callable[[Op], dict[str, Any]], manager: RequestManager
    ) -> None:
        self.trace = trace
        self.apply = apply
        self.manager = manager
        self.stats = LookupStats()
        self.held: dict[str, int] = {}  # request id -> its tokens in the runtime
        self.refused: list[str] = []  # admissions refused for a reason other than room
        self.lost: list[str] = []  # running requests the runtime no longer holds

    def _tokens_of(self, req: SlotRequest) -> LiveTokens:
        tokens = req.hashable
        assert isinstance(tokens, LiveTokens)
        return tokens

    def tokens(self, live: LiveTokens, start: int, stop: int) -> list[int]:
        """Tokens ``[start:stop]`` of the request's prompt and outputs."""
        trace, req = self.trace, live.request
        n = req.input_length
        out = trace.prompt_token_ids(req, start, stop) if start < n else []
        if stop > n:
            out += trace.output_token_ids(req, max(start - n, 0), stop - n)
        return out

    def lookup(self, req: SlotRequest) -> tuple[list[KVCacheBlock], int]:
        live = self._tokens_of(req)
        target = req.num_tokens
        tr = live.request
        bs = self.manager.block_size
        m = min(target, 4 * bs)
        while True:
            toks = self.tokens(live, 0, m)
            hit = self.manager.lookup(toks, lora_name=tr.lora_name, cache_salt=tr.cache_salt)
            if m >= target or hit < (m - 1) // bs * bs:
                break
            m = min(target, 2 * m)
        self.stats.count(req, hit)
        return [], hit

    def allocate(
        self,
        req: SlotRequest,
        num_new: int,
        num_hit: int = 0,
        hit: Sequence[KVCacheBlock] = (),  # noqa: ARG002 vLLM's request/manager interface
        *,
        cache: bool = True,  # noqa: ARG002 vLLM's request/manager interface
    ) -> bool:
        live = self._tokens_of(req)
        rid = req.rid
        held = self.held.get(rid)
        if held is None:
            upto = num_hit + num_new
            tr = live.request
            op: Op = AdmitOp(
                request_id=rid,
                token_ids=self.tokens(live, 0, upto),
                lora_name=tr.lora_name,
                cache_salt=tr.cache_salt,
            )
        else:
            upto = req.num_computed + num_new
            if upto <= held:
                return True
            op = AppendOp(request_id=rid, token_ids=self.tokens(live, held, upto))
        try:
            self.apply(op)
        except NotEnoughBlocks:
            if held is None and not self.held:
                self.refused.append(rid)  # nothing of ours to free: it would wait forever
            return False
        except OperationError:
            if held is None:
                self.refused.append(rid)
                return False
            del self.held[rid]  # finished by another client: recomputed (``lost``)
            self.lost.append(rid)
            return True
        self.held[rid] = upto
        return True

    def cache_blocks(self, req: SlotRequest, num_tokens: int) -> None:
        raise NotImplementedError("runtime slots serve synchronous scheduling only")

    def misses(self, req: SlotRequest, num_hit: int) -> MissArgs:
        raise NotImplementedError("the service's analysis classifies the runtime's misses")

    def add_misses(self, m: MissArgs) -> None:
        raise NotImplementedError("the service's analysis classifies the runtime's misses")

    def free(self, req: SlotRequest) -> None:
        if self.held.pop(req.rid, None) is not None:
            with contextlib.suppress(OperationError):  # a client may have finished it
                self.apply(FinishOp(request_id=req.rid))
