#!/usr/bin/env python3
"""compare_vllm_current.py -- our ``free_order="uncached_first"`` against the
current vLLM's BlockPool (0.33.0), which frees that way.

Runs with an interpreter that has vLLM 0.33.0 installed (``pip install
--no-deps vllm==0.33.0`` into its own venv, plus a CPU torch and the support
packages its pool modules import; see docs/vllm-parity.md):

    /tmp/vllm033/bin/python bench/compare_vllm_current.py [--seeds 40] [--ops 400]

Seeded operation sequences drive both pools the way a KV-cache manager does
(prefix lookup and touch of the hits, allocation of the rest, caching of the
full blocks, decode that fills and caches blocks, frees in reverse, forward
and shuffled order, several tables at once, leading null blocks as a sliding
window leaves them, evict_blocks, reset_prefix_cache), with caching on and
off.  Both sides get the same block hashes (ours), so only the pools are
compared.  After every operation: the same block ids returned, the same
free queue order, the same ref counts (the null block's is not kept by
either), the same hash on every block, the same hash map (key -> block ids),
the same free count and usage, and the same events (kind and hashes).

Prints a summary; exits 1 on any divergence.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

try:
    import importlib.metadata as md

    from vllm.v1.core.block_pool import BlockPool as VBlockPool
except ImportError as exc:  # pragma: no cover - needs the vLLM venv
    sys.exit(f"compare_vllm_current: vLLM is not importable ({exc})")

import blockpool as bp  # noqa: E402

logging.getLogger("vllm").setLevel(logging.ERROR)
logging.getLogger("blockpool").setLevel(logging.ERROR)

VOCAB = 500


class Divergence(AssertionError):
    pass


@dataclass(frozen=True)
class Config:
    name: str
    num_blocks: int
    block_size: int
    caching: bool
    groups: int = 1


CONFIGS = [
    Config("caching on", 64, 4, True),
    Config("caching on, two groups", 96, 4, True, groups=2),
    Config("caching on, tiny pool", 20, 2, True),
    Config("caching off", 48, 4, False),
]


@dataclass
class Req:
    rid: str
    tokens: list[int]
    hashes: list[bytes]
    tables: list[list[int]]  # block ids per group
    cached: int  # full blocks cached (per group, the same)


def queue_ids(pool: Any) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def map_view(pool: Any) -> dict[bytes, list[int]]:
    out = {}
    for k, entry in pool.cached_block_hash_to_block._cache.items():
        out[k] = sorted(entry) if isinstance(entry, dict) else [entry.block_id]
    return out


def event_view(ev: Any) -> tuple[Any, ...]:
    return (type(ev).__name__, tuple(getattr(ev, "block_hashes", ()) or ()))


class Driver:
    def __init__(self, cfg: Config, seed: int) -> None:
        self.cfg, self.seed = cfg, seed
        self.rng = random.Random(seed * 7717 + cfg.num_blocks)
        self.v = VBlockPool(cfg.num_blocks, cfg.caching, cfg.block_size, True)
        self.o = bp.BlockPool(
            cfg.num_blocks, cfg.caching, cfg.block_size, True, free_order="uncached_first"
        )
        self.hasher = bp.get_request_block_hasher(cfg.block_size, bp.sha256)
        self.docs = [
            [self.rng.randrange(VOCAB) for _ in range(cfg.block_size * self.rng.randint(1, 6))]
            for _ in range(5)
        ]
        self.reqs: dict[str, Req] = {}
        self.next_id = 0
        self.op = "start"
        self.ops = 0
        self.counts: dict[str, int] = {}
        self.events = 0
        self.hits = 0

    def bump(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def fail(self, msg: str) -> None:
        raise Divergence(f"[{self.cfg.name}, seed {self.seed}, op {self.ops} {self.op}] {msg}")

    def blocks(self, pool: Any, ids: Sequence[int]) -> list[Any]:
        return [pool.blocks[i] for i in ids]

    # ------------------------------------------------------------ compare

    def compare(self) -> None:
        v, o = self.v, self.o
        if queue_ids(v) != queue_ids(o):
            self.fail(f"free queue: vllm {queue_ids(v)} ours {queue_ids(o)}")
        vb = [(b.ref_cnt, b.block_hash) for b in v.blocks[1:]]
        ob = [(b.ref_cnt, b.block_hash) for b in o.blocks[1:]]
        if vb != ob:
            bad = next(i + 1 for i, (x, y) in enumerate(zip(vb, ob, strict=True)) if x != y)
            self.fail(f"block {bad}: vllm {vb[bad - 1]} ours {ob[bad - 1]}")
        if map_view(v) != map_view(o):
            self.fail("hash map contents differ")
        if (v.get_num_free_blocks(), v.get_usage()) != (o.get_num_free_blocks(), o.get_usage()):
            self.fail("free count or usage differ")
        ve = [event_view(e) for e in v.take_events()]
        oe = [event_view(e) for e in o.take_events()]
        if ve != oe:
            self.fail(f"events differ: vllm {ve[:4]} ours {oe[:4]}")
        self.events += len(ve)

    def both(self, fn: str, *args: Any) -> Any:
        """Call ``fn`` on both pools (block arguments translated); the same
        result, or the same exception type."""
        res = []
        for pool in (self.v, self.o):
            conv = [self.blocks(pool, a) if isinstance(a, BlockIds) else a for a in args]
            try:
                out = getattr(pool, fn)(*conv)
                res.append(("ok", [b.block_id for b in out] if isinstance(out, list) else out))
            except (ValueError, AssertionError) as e:
                res.append(("raised", type(e).__name__))
        if res[0] != res[1]:
            self.fail(f"{fn}: vllm {res[0]} ours {res[1]}")
        if res[0][0] != "ok":
            self.fail(f"{fn}{args!r}: both raised {res[0][1]} (a driver bug)")
        return res[0][1]

    # ------------------------------------------------------------ ops

    def admit(self) -> None:
        cfg, rng = self.cfg, self.rng
        bs = cfg.block_size
        tokens = list(rng.choice(self.docs)) if rng.random() < 0.8 else []
        if tokens and rng.random() < 0.4:
            tokens = tokens[: rng.randint(1, len(tokens))]
        tokens += [rng.randrange(VOCAB) for _ in range(rng.randint(1, 3 * bs))]
        r = bp.Request("x", tokens, block_hasher=self.hasher)
        hashes = list(r.block_hashes)
        gids = list(range(cfg.groups))
        hit_ids: list[list[int]] = [[] for _ in gids]
        if cfg.caching:
            for h in hashes[: (len(tokens) - 1) // bs]:
                got = self.v.get_cached_block(h, gids)
                mine = self.o.get_cached_block(h, gids)
                if (got is None) != (mine is None) or (
                    got is not None and mine is not None
                    and [b.block_id for b in got] != [b.block_id for b in mine]
                ):  # fmt: skip
                    self.fail("get_cached_block differs")
                if got is None:
                    break
                for g, b in enumerate(got):
                    hit_ids[g].append(b.block_id)
        nhit = len(hit_ids[0])
        need = -(-len(tokens) // bs) - nhit
        sparse = cfg.groups == 1 and nhit == 0 and need > 2 and rng.random() < 0.1
        lead = rng.randint(1, need - 1) if sparse else 0
        # hits sitting in the free queue leave it when touched
        queued = sum(self.o.blocks[i].ref_cnt == 0 for t in hit_ids for i in t)
        if need * cfg.groups - lead + queued > self.o.get_num_free_blocks():
            self.bump("refused")
            return
        for g in gids:
            self.both("touch", BlockIds(hit_ids[g]))
        self.hits += nhit
        tables = []
        for g in gids:
            new = self.both("get_new_blocks", need - lead if g == 0 else need)
            tables.append([0] * lead + hit_ids[g] + new if g == 0 else hit_ids[g] + new)
        rid = f"r{self.next_id}"
        self.next_id += 1
        req = Req(rid, tokens, hashes, tables, nhit)
        self.reqs[rid] = req
        self.bump("admit sparse" if sparse else "admit")
        self.cache(req)

    def cache(self, req: Req) -> None:
        if not self.cfg.caching:
            return
        full = len(req.tokens) // self.cfg.block_size
        if full <= req.cached:
            return
        ns = types.SimpleNamespace(
            block_hashes=req.hashes, all_token_ids=req.tokens, lora_request=None,
            mm_features=[], cache_salt=None, prompt_embeds=None, num_tokens=len(req.tokens),
            session_id=None,
        )  # fmt: skip
        for g, table in enumerate(req.tables):
            for pool in (self.v, self.o):
                pool.cache_full_blocks(
                    ns, self.blocks(pool, table), req.cached, full, self.cfg.block_size, g
                )
        req.cached = full

    def decode(self) -> None:
        req = self.reqs[self.rng.choice(list(self.reqs))]
        bs = self.cfg.block_size
        k = self.rng.choice([1, 1, 2, 5, bs])
        req.tokens += [self.rng.randrange(VOCAB) for _ in range(k)]
        need = -(-len(req.tokens) // bs) - len(req.tables[0])
        if need * self.cfg.groups > self.o.get_num_free_blocks():
            del req.tokens[-k:]
            self.finish(req.rid, "preempt")
            return
        for table in req.tables:
            table += self.both("get_new_blocks", need) if need else []
        full = len(req.tokens) // bs
        r = bp.Request("x", req.tokens, block_hasher=self.hasher)
        req.hashes = list(r.block_hashes)
        assert len(req.hashes) == full
        self.cache(req)
        self.bump("decode")

    def finish(self, rid: str, how: str | None = None) -> None:
        req = self.reqs.pop(rid)
        how = how or self.rng.choice(["reverse"] * 6 + ["forward", "shuffle", "together"])
        if how == "together":
            tables = [t for t in req.tables]
            order = [b for t in tables for b in reversed(t)]
            self.both("free_blocks", BlockIds(order))
        else:
            for table in req.tables:
                order = list(reversed(table)) if how in ("reverse", "preempt") else list(table)
                if how == "shuffle":
                    self.rng.shuffle(order)
                self.both("free_blocks", BlockIds(order))
        self.bump(f"free {how}")

    def evict(self) -> None:
        n = self.cfg.num_blocks
        ids = {self.rng.randrange(n) for _ in range(self.rng.randint(1, 4))}
        self.both("evict_blocks", ids)
        self.bump("evict_blocks")

    def reset(self) -> None:
        if self.rng.random() < 0.6:
            for rid in list(self.reqs):
                self.finish(rid, "reverse")
        ok = self.both("reset_prefix_cache")
        self.bump("reset accepted" if ok else "reset refused")

    def run(self, ops: int) -> Driver:
        rng = self.rng
        self.compare()
        for _ in range(ops):
            x = rng.random()
            if x < 0.35 or not self.reqs:
                self.op = "admit"
                self.admit()
            elif x < 0.7:
                self.op = "decode"
                self.decode()
            elif x < 0.95:
                self.op = "finish"
                self.finish(rng.choice(list(self.reqs)))
            elif x < 0.98:
                self.op = "evict"
                self.evict()
            else:
                self.op = "reset"
                self.reset()
            self.compare()
            bp.check_invariants(self.o)
            self.ops += 1
        return self


class BlockIds(list):  # type: ignore[type-arg]
    """An argument to translate into each pool's own blocks."""


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=40, help="seeds per configuration")
    p.add_argument("--ops", type=int, default=400, help="operations per run")
    p.add_argument("--first-seed", type=int, default=1)
    args = p.parse_args(argv)
    bp.init_none_hash(bp.sha256, seed="0")
    version = md.version("vllm")
    t0 = time.perf_counter()
    failures = runs = ops = events = hits = 0
    counts: dict[str, int] = {}
    for cfg in CONFIGS:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            runs += 1
            try:
                d = Driver(cfg, seed).run(args.ops)
            except Divergence as e:
                failures += 1
                print(f"DIVERGENCE {e}", flush=True)
                continue
            ops, events, hits = ops + d.ops, events + d.events, hits + d.hits
            for k, v in d.counts.items():
                counts[k] = counts.get(k, 0) + v
        print(f"  {cfg.name:<24} {args.seeds} seeds done", flush=True)
    print("operations exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(
        f"{runs - failures}/{runs} runs identical to vLLM {version}'s BlockPool: {ops} ops, "
        f"{events} events, {hits} hit blocks, in {time.perf_counter() - t0:.1f}s"
    )
    if failures:
        print(f"FAILED: {failures} run(s) diverged")
        return 1
    print(f"OK: free_order='uncached_first' matches vLLM {version} call for call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
