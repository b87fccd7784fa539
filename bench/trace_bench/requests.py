"""``bench_trace.py requests``: see bench/bench_trace.py."""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

from blockpool import BlockPool, init_none_hash, sha256
from blockpool.trace import read_trace
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.workload.reader import Trace
from trace_bench.curve import BLOCK_SIZE

# ---------------------------------------------------------------- request level

# ("a", rid, request index, outputs, hit | None) / ("p", rid, token, ok) / ("f", rid)
Op = tuple[Any, ...]


class Recorder:
    """The scheduler's slots (every feature off: whole prompts, a token a
    step) on our RequestManager, recording every call."""

    counts_misses = False

    def __init__(self, manager: Any) -> None:
        from blockpool.trace.sched.slots import LookupStats

        self.m = manager
        self.ops: list[Op] = []
        self.stats = LookupStats()
        self.held: set[str] = set()
        self.frees = 0
        # (request, frees then) of the last refused admission: until blocks
        # are freed, free blocks only shrink and the need only grows, so a
        # retry would fail the same way (not replayed, as before)
        self.blocked: tuple[str, int] | None = None
        self._exc = __import__("blockpool").NotEnoughBlocksError

    def lookup(self, req: Any) -> tuple[list[Any], int]:
        r = req.hashable
        hit = len(self.m.find_longest_cache_hit(r.block_hashes, r.num_tokens)[0]) * BLOCK_SIZE
        self.stats.count(req, hit)
        return [], hit

    def allocate(self, req: Any, num_new: int, num_hit: int = 0, hit: Any = (), *,  # noqa: ARG002 the manager's allocate signature
                 cache: bool = True) -> bool:  # fmt: skip  # noqa: ARG002 the manager's allocate signature
        r, rid = req.hashable, req.rid
        if rid not in self.held:
            if self.blocked == (rid, self.frees):
                return False
            tokens = r.all_token_ids
            try:
                got: int | None = self.m.admit(rid, tokens).num_computed_tokens
            except self._exc:
                got = None
            self.ops.append(("a", rid, req.index, len(tokens) - r.num_prompt_tokens, got))
            if got is None:
                self.blocked = (rid, self.frees)
                return False
            self.held.add(rid)
            return True
        token = r.all_token_ids[req.num_computed]
        try:
            self.m.append_tokens(rid, [token])
            ok = True
        except self._exc:
            ok = False
        self.ops.append(("p", rid, token, ok))
        return ok

    def cache_blocks(self, req: Any, num_tokens: int) -> None:
        raise NotImplementedError("synchronous scheduling only")

    def misses(self, req: Any, num_hit: int) -> Any:
        raise NotImplementedError

    def add_misses(self, m: Any) -> None:
        raise NotImplementedError

    def free(self, req: Any) -> None:
        if req.rid in self.held:
            self.frees += 1
            self.held.discard(req.rid)
            self.m.finish(req.rid)
            self.ops.append(("f", req.rid))


class Ours:
    def __init__(self, num_blocks: int) -> None:
        from blockpool import NotEnoughBlocksError, RequestManager

        self.pool = BlockPool(num_blocks, True, BLOCK_SIZE)
        self.m = RequestManager(self.pool, hash_fn=sha256)
        self.exc = NotEnoughBlocksError

    def run(self, ops: list[Op], tokens: dict[int, list[int]]) -> list[Any]:
        m, exc = self.m, self.exc
        admit, append, finish = m.admit, m.append_tokens, m.finish
        out: list[Any] = []
        put = out.append
        for op in ops:
            kind = op[0]
            if kind == "p":
                try:
                    append(op[1], [op[2]])
                except exc:
                    put(False)
            elif kind == "a":
                try:
                    put(admit(op[1], tokens[id(op)]).num_computed_tokens)
                except exc:
                    put(None)
            else:
                finish(op[1])
        return out


class Vllm:
    """vLLM 0.16.0's KVCacheManager, driven as its tests drive it."""

    def __init__(self, num_blocks: int) -> None:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256 as vsha256
        from vllm.v1.core import kv_cache_utils as ku
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request

        ku.init_none_hash(vsha256)
        spec = FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
        )
        config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
        )
        self.m = KVCacheManager(
            config, max_model_len=1 << 22, hash_block_size=BLOCK_SIZE, enable_caching=True
        )
        self.Request = Request
        self.params = SamplingParams(max_tokens=1 << 20)
        self.hasher = ku.get_request_block_hasher(BLOCK_SIZE, vsha256)
        self.reqs: dict[str, Any] = {}
        self.pending: set[str] = set()

    def run(self, ops: list[Op], tokens: dict[int, list[int]]) -> list[Any]:
        m, reqs, pending = self.m, self.reqs, self.pending
        make, params, hasher = self.Request, self.params, self.hasher
        get_computed, allocate, free = m.get_computed_blocks, m.allocate_slots, m.free
        out: list[Any] = []
        put = out.append
        for op in ops:
            kind = op[0]
            if kind == "p":
                rid = op[1]
                req = reqs[rid]
                if rid in pending:  # appended on the failed try already
                    pending.discard(rid)
                else:
                    req.append_output_token_ids(op[2])
                if allocate(req, 1) is None:
                    pending.add(rid)
                    put(False)
                else:
                    req.num_computed_tokens += 1
            elif kind == "a":
                rid = op[1]
                toks = tokens[id(op)]
                req = make(rid, toks, params, None, 100, block_hasher=hasher)
                computed, n = get_computed(req)
                if allocate(req, len(toks) - n, n, computed) is None:
                    put(None)
                else:
                    req.num_computed_tokens = len(toks)
                    reqs[rid] = req
                    put(n)
            else:
                rid = op[1]
                free(reqs.pop(rid))
                pending.discard(rid)
        return out


def _expected(ops: list[Op]) -> list[Any]:
    return [op[4] if op[0] == "a" else False for op in ops if op[0] == "a" or (
        op[0] == "p" and not op[3])]  # fmt: skip


def _windows(ops: list[Op], admits: int) -> list[list[Op]]:
    out: list[list[Op]] = [[]]
    n = 0
    for op in ops:
        out[-1].append(op)
        if op[0] == "a":
            n += 1
            if n % admits == 0:
                out.append([])
    return [w for w in out if w]


def bench_requests(args: argparse.Namespace) -> dict[str, Any]:
    from blockpool import RequestManager
    from blockpool.trace.sched.engine_core import StepModel
    from blockpool.trace.sched.scheduled import run_scheduled
    from blockpool.trace.sched.timed import simple_scheduler

    init_none_hash(sha256)
    trace = read_trace(args.trace)
    if args.requests:
        trace = Trace(trace.requests[: args.requests], trace.tokens_per_id)
    blocks = args.capacity_tokens // BLOCK_SIZE
    pool = BlockPool(blocks, True, BLOCK_SIZE)
    rec = Recorder(RequestManager(pool, hash_fn=sha256))
    res = CapacityResult(args.capacity_tokens, blocks)
    t0 = time.perf_counter()
    run_scheduled(trace, pool, BLOCK_SIZE, sha256, res, simple_scheduler(256), StepModel(20.0),
                  args.speed, slots=rec)  # fmt: skip
    ops = rec.ops
    n_adm = sum(1 for o in ops if o[0] == "a")
    n_app = sum(1 for o in ops if o[0] == "p")
    print(
        f"timed replay of {len(trace)} requests at {blocks} blocks, speed {args.speed}: "
        f"{len(ops)} calls ({n_adm} admits, {n_app} appends), {res.preemptions} preemptions, "
        f"hit rate {res.hit_rate:.4f}; recorded in {time.perf_counter() - t0:.1f}s"
    )
    want = _expected(ops)
    ours, theirs = Ours(blocks), Vllm(blocks)
    t_ours = t_vllm = 0.0
    got_o: list[Any] = []
    got_v: list[Any] = []
    for i, win in enumerate(_windows(ops, args.window)):
        tokens = {}
        for op in win:
            if op[0] == "a":
                r = trace.requests[op[2]]
                toks = trace.prompt_token_ids(r)
                if op[3]:
                    toks += trace.output_token_ids(r)[: op[3]]
                tokens[id(op)] = toks
        sides = [(ours, got_o), (theirs, got_v)]
        for side, got in sides if i % 2 == 0 else sides[::-1]:
            gc.collect()
            t0 = time.perf_counter()
            got += side.run(win, tokens)
            dt = time.perf_counter() - t0
            if side is ours:
                t_ours += dt
            else:
                t_vllm += dt
    same = got_o == want and got_v == want
    hits = sum(h for o in ops if o[0] == "a" and (h := o[4]) is not None)
    out = {
        "requests": len(trace),
        "capacity_tokens": args.capacity_tokens,
        "calls": len(ops),
        "admits": n_adm,
        "appends": n_app,
        "preemptions": res.preemptions,
        "hit_tokens_all_admissions": hits,
        "identical": same,
        "seconds_ours": t_ours,
        "seconds_vllm": t_vllm,
        "ratio": t_vllm / t_ours,
    }
    print(
        f"same hits and failures on both sides: {same}; ours {t_ours:.2f}s, "
        f"vLLM KVCacheManager {t_vllm:.2f}s: ours {out['ratio']:.2f}x"
    )
    if args.profile:
        import cProfile
        import io
        import pstats

        for name, side in (("ours", Ours(blocks)), ("vllm", Vllm(blocks))):
            prof = cProfile.Profile()
            for win in _windows(ops, args.window):
                tokens = {id(op): trace.prompt_token_ids(trace.requests[op[2]])
                          + trace.output_token_ids(trace.requests[op[2]])[: op[3]]
                          for op in win if op[0] == "a"}  # fmt: skip
                prof.enable()
                side.run(win, tokens)
                prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
            print(f"--- profile: {name}")
            print(buf.getvalue()[-4000:])
    return out
