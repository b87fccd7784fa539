"""Production-trace benchmarks against vLLM 0.16.0, in one process.

    /tmp/vllm016/bin/python bench/bench_trace.py curve TRACE.jsonl [--json OUT]
    /tmp/vllm016/bin/python bench/bench_trace.py requests TRACE.jsonl [--json OUT]

(the venv of ``vllm016_setup.sh``; the trace path is required.)

``curve`` -- bar 11-trace-replay.  Sequence mode at 16-token blocks and five
capacities: the one-pass curve and vLLM 0.16.0's own BlockPool (five pools
driven in one loop by ``SequenceDriver``, events on to count evictions) must
give the same hit tokens, evictions and refusals at every capacity (our own
pool is held to the curve by tests/trace).  Then timed, alternating, several
rounds: the whole five-point one-pass curve (from the parsed trace: block
naming included) against ONE unbounded replay on vLLM's pool (and on ours),
given the block hashes ready-made (hashing and pool construction are not
counted on the pools' side).

``requests`` -- issue item 6.  A timed replay of the trace (the scheduler of
``blockpool.trace.timed``) is run once on our RequestManager and its calls
recorded (admit with the prompt, one append per decode token, finish); the
same calls are then replayed, alternating A/B, on our RequestManager and on
vLLM 0.16.0's KVCacheManager driven as its own tests drive it
(``Request`` with a block hasher, ``get_computed_blocks``, ``allocate_slots``,
``free``; one full-attention group, no GPU).  Both must give the same hit
count at every admission and fail the same appends.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PYTHONHASHSEED", "0")

from blockpool import BlockPool, init_none_hash, sha256  # noqa: E402
from blockpool.block_hasher import get_request_block_hasher  # noqa: E402
from blockpool.trace import one_pass_curve, read_trace  # noqa: E402
from blockpool.trace.keys import make_request  # noqa: E402
from blockpool.trace.reader import Trace  # noqa: E402
from blockpool.trace.results import CapacityResult, capacity_blocks  # noqa: E402
from blockpool.trace.sequence import SequenceDriver, unbounded_blocks  # noqa: E402

BLOCK_SIZE = 16
CAPACITIES = [1 << 16, 1 << 18, 1 << 20, 1 << 21, 1 << 22]  # tokens


def vllm_pool_class() -> Any:
    from vllm.v1.core.block_pool import BlockPool as VllmBlockPool

    return VllmBlockPool


class _Req:
    __slots__ = ("all_token_ids", "block_hashes", "lora_request")

    def __init__(self, tokens: list[int], hashes: list[bytes]) -> None:
        self.all_token_ids = tokens
        self.block_hashes = hashes
        self.lora_request = None


def hashed_requests(trace: Trace) -> list[tuple[int, _Req]]:
    """Every request's prompt length and block hashes (tokens dropped: events off)."""
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    out = []
    for i, req in enumerate(trace.requests):
        r = make_request(trace, req, str(i), hasher)
        out.append((req.input_length, _Req([], r.block_hashes)))
    return out


def timed_replay(pool: Any, reqs: list[tuple[int, _Req]], cap: int | None) -> tuple[float, int]:
    """One sequence replay on ``pool`` (events off); (seconds, hit tokens)."""
    d = SequenceDriver(pool, BLOCK_SIZE, CapacityResult(cap, None), reasons=False)
    step = d.step
    gc.collect()
    t0 = time.perf_counter()
    for n, r in reqs:
        step(n, r, r.block_hashes)
    return time.perf_counter() - t0, d.result.hit_tokens


def lockstep(pools: list[Any], reqs: list[tuple[int, _Req]], caps: list[int | None]) -> Any:
    """Sequence replays on several pools in one loop (events on: evictions)."""
    drivers = [
        SequenceDriver(p, BLOCK_SIZE, CapacityResult(c, capacity_blocks(c, BLOCK_SIZE)), False)
        for p, c in zip(pools, caps, strict=True)
    ]
    gc.collect()
    t0 = time.perf_counter()
    for n, r in reqs:
        for d in drivers:
            d.step(n, r, r.block_hashes)
    return time.perf_counter() - t0, [d.result for d in drivers]


def bench_curve(args: argparse.Namespace) -> dict[str, Any]:
    init_none_hash(sha256)
    trace = read_trace(args.trace)
    vpool = vllm_pool_class()
    caps: list[int | None] = list(CAPACITIES)
    print(f"trace {args.trace}: {len(trace)} requests, {trace.prompt_tokens} prompt tokens")

    # 1. the five-point curve (+ inf) and vLLM's own pools at the five capacities
    t0 = time.perf_counter()
    curve = one_pass_curve(trace, BLOCK_SIZE, [*caps, None])
    print(f"curve + inf: {time.perf_counter() - t0:.1f}s", flush=True)
    reqs = hashed_requests(trace)  # hashing is not timed on vLLM's side
    print(f"hashed: {time.perf_counter() - t0:.1f}s", flush=True)
    blocks = [capacity_blocks(c, BLOCK_SIZE) for c in caps]
    t_vcaps, theirs = lockstep([vpool(b, True, BLOCK_SIZE, True) for b in blocks], reqs, caps)
    print(f"vLLM's five pools: {t_vcaps:.1f}s", flush=True)
    same = True
    rows = []
    for c, v in zip(curve, theirs, strict=False):
        ok = c.counts() == v.counts()
        same &= ok
        rows.append({**c.to_json(), "vllm_pool": v.counts(), "same": ok})
    inf = curve[-1]
    rows.append(inf.to_json())
    print(f"identical to vLLM's pool (hit tokens, evictions, refused) at every capacity: {same}")
    print(f"unbounded hit rate {inf.hit_rate:.4f} (paper: 0.66)")
    print("capacity_tokens  blocks  hit_rate  hit_tokens  evictions  refused  vllm_hit_tokens")
    for c, v in zip(curve, [*theirs, None], strict=True):
        cap = "inf" if c.capacity_tokens is None else str(c.capacity_tokens)
        vh = "-" if v is None else str(v.hit_tokens)
        nb = "inf" if c.blocks is None else str(c.blocks)
        print(
            f"{cap:>15}  {nb:>6}  {c.hit_rate:8.4f}  {c.hit_tokens:>10}  "
            f"{c.evictions:>9}  {c.refused:>7}  {vh:>15}",
            flush=True,
        )

    # 2. speed: the five-point curve vs ONE unbounded vLLM replay, alternating
    n_inf = unbounded_blocks(trace, BLOCK_SIZE)
    t_curve, t_vinf, t_oinf = [], [], []
    stacks = 0
    for i in range(args.rounds):
        order = ["curve", "vllm", "ours"] if i % 2 == 0 else ["ours", "vllm", "curve"]
        for what in order:
            if what == "curve":
                gc.collect()
                t0 = time.perf_counter()
                res = one_pass_curve(trace, BLOCK_SIZE, caps)
                t_curve.append(time.perf_counter() - t0)
                stacks = int(res[0].extra["stacks"])
                assert [r.hit_tokens for r in res] == [r.hit_tokens for r in curve[:-1]]
            elif what == "vllm":
                t, h = timed_replay(vpool(n_inf, True, BLOCK_SIZE, False), reqs, None)
                t_vinf.append(t)
                assert h == inf.hit_tokens, (h, inf.hit_tokens)
            else:
                t, h = timed_replay(BlockPool(n_inf, True, BLOCK_SIZE, False), reqs, None)
                t_oinf.append(t)
                assert h == inf.hit_tokens
        print(f"round {i + 1}: curve {t_curve[-1]:.2f}s, vLLM unbounded {t_vinf[-1]:.2f}s, "
              f"ours unbounded {t_oinf[-1]:.2f}s", flush=True)  # fmt: skip
    med = statistics.median
    out = {
        "trace": str(args.trace),
        "requests": len(trace),
        "identical": same,
        "unbounded_hit_rate": inf.hit_rate,
        "curve": rows,
        "stacks": stacks,
        "seconds": {
            "one_pass_5_capacities": med(t_curve),
            "vllm_one_unbounded_replay": med(t_vinf),
            "ours_one_unbounded_replay": med(t_oinf),
            "vllm_5_capacity_replays_events_on": t_vcaps,
            "rounds": args.rounds,
        },
    }
    s = out["seconds"]
    ratio = s["vllm_one_unbounded_replay"] / s["one_pass_5_capacities"]
    out["bar_met"] = same and ratio >= 1.0
    print(
        f"one-pass 5-point curve {s['one_pass_5_capacities']:.2f}s ({stacks} stack(s)); "
        f"ONE unbounded vLLM replay {s['vllm_one_unbounded_replay']:.2f}s "
        f"(ours {s['ours_one_unbounded_replay']:.2f}s); "
        f"vLLM's 5 per-capacity pools {t_vcaps:.2f}s"
    )
    print(f"curve is {ratio:.1f}x faster than one vLLM unbounded replay; bar met: {out['bar_met']}")
    return out


# ------------------------------------------------------- request level (item 6)

# ("a", rid, request index, outputs, hit | None) / ("p", rid, token, ok) / ("f", rid)
Op = tuple[Any, ...]


class Recorder:
    """A timed-replay backend on our RequestManager that records every call."""

    def __init__(self, manager: Any) -> None:
        self.m = manager
        self.ops: list[Op] = []
        self._exc = __import__("blockpool").NotEnoughBlocksError

    def admit(self, rid: str, tokens: list[int], req: Any, first: bool) -> int | None:
        try:
            hit = self.m.admit(rid, tokens).num_computed_tokens
        except self._exc:
            hit = None
        self.ops.append(("a", rid, req.index, len(tokens) - req.input_length, hit))
        return hit

    def append(self, rid: str, token: int) -> bool:
        try:
            self.m.append_tokens(rid, [token])
            ok = True
        except self._exc:
            ok = False
        self.ops.append(("p", rid, token, ok))
        return ok

    def finish(self, rid: str) -> None:
        self.m.finish(rid)
        self.ops.append(("f", rid))


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
    from blockpool.trace.timed import TimedConfig, run_timed

    init_none_hash(sha256)
    trace = read_trace(args.trace)
    if args.requests:
        trace = Trace(trace.requests[: args.requests], trace.tokens_per_id)
    blocks = args.capacity_tokens // BLOCK_SIZE
    rec = Recorder(RequestManager(BlockPool(blocks, True, BLOCK_SIZE), hash_fn=sha256))
    res = CapacityResult(args.capacity_tokens, blocks)
    t0 = time.perf_counter()
    run_timed(trace, rec, res, blocks - 1, BLOCK_SIZE, TimedConfig(speed=args.speed))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("curve", help="bar 11-trace-replay")
    c.add_argument("trace", type=Path)
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--json", type=Path, help="write the figures here")
    r = sub.add_parser("requests", help="request level: RequestManager vs KVCacheManager")
    r.add_argument("trace", type=Path)
    r.add_argument("--capacity-tokens", type=int, default=1 << 20)
    r.add_argument("--speed", type=float, default=1.0)
    r.add_argument("--requests", type=int, default=0, help="only the first N (0: all)")
    r.add_argument("--window", type=int, default=100, help="admissions per A/B window")
    r.add_argument("--profile", action="store_true", help="cProfile both sides after")
    r.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    out = bench_curve(args) if args.what == "curve" else bench_requests(args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if out.get("identical", True) else 1


if __name__ == "__main__":
    sys.exit(main())
