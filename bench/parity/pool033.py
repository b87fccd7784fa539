"""vLLM 0.33.0's BlockPool against ours with ``free_order="uncached_first"``:
seeded operations as a KV-cache manager makes them (prefix lookup and touch,
allocation, caching of full blocks, decode, frees in several orders, leading
nulls, evict_blocks, reset_prefix_cache), caching on and off.  Both pools get
the same block hashes (ours), so only the pools are compared.
"""

from __future__ import annotations

import random
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm.v1.core.block_pool import BlockPool as VBlockPool

import blockpool as bp

from .common import Run, RunStats

VOCAB = 500


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


def kind_and_hashes(ev: Any) -> tuple[Any, ...]:
    """An event as both versions spell it: its type and block hashes."""
    return (type(ev).__name__, tuple(getattr(ev, "block_hashes", ()) or ()))


class BlockIds(list):  # type: ignore[type-arg]
    """An argument to translate into each pool's own blocks."""


class Driver(Run):
    def __init__(self, cfg: Config, seed: int) -> None:
        super().__init__(cfg.name, seed)
        self.cfg = cfg
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

    def blocks(self, pool: Any, ids: Sequence[int]) -> list[Any]:
        return [pool.blocks[i] for i in ids]

    # ------------------------------------------------------------ compare

    def compare(self) -> None:
        v, o = self.v, self.o
        self.same_free_queue(v, o)
        # the null block's ref count is kept by neither
        vb = [(b.ref_cnt, b.block_hash) for b in v.blocks[1:]]
        ob = [(b.ref_cnt, b.block_hash) for b in o.blocks[1:]]
        if vb != ob:
            bad = next(i + 1 for i, (x, y) in enumerate(zip(vb, ob, strict=True)) if x != y)
            self.fail(f"block {bad}: vllm {vb[bad - 1]} ours {ob[bad - 1]}")
        self.same_hash_map(v, o, exact=False)
        if (v.get_num_free_blocks(), v.get_usage()) != (o.get_num_free_blocks(), o.get_usage()):
            self.fail("free count or usage differ")
        self.stats.events += self.same_taken_events(v, o, kind_and_hashes, shown=4)

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
            self.stats.bump("refused")
            return
        for g in gids:
            self.both("touch", BlockIds(hit_ids[g]))
        self.stats.hits += nhit
        tables = []
        for g in gids:
            new = self.both("get_new_blocks", need - lead if g == 0 else need)
            tables.append([0] * lead + hit_ids[g] + new if g == 0 else hit_ids[g] + new)
        rid = f"r{self.next_id}"
        self.next_id += 1
        req = Req(rid, tokens, hashes, tables, nhit)
        self.reqs[rid] = req
        self.stats.bump("admit sparse" if sparse else "admit")
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
        self.stats.bump("decode")

    def finish(self, rid: str, how: str | None = None) -> None:
        req = self.reqs.pop(rid)
        how = how or self.rng.choice(["reverse"] * 6 + ["forward", "shuffle", "together"])
        if how == "together":
            tables = list(req.tables)
            order = [b for t in tables for b in reversed(t)]
            self.both("free_blocks", BlockIds(order))
        else:
            for table in req.tables:
                order = list(reversed(table)) if how in ("reverse", "preempt") else list(table)
                if how == "shuffle":
                    self.rng.shuffle(order)
                self.both("free_blocks", BlockIds(order))
        self.stats.bump(f"free {how}")

    def evict(self) -> None:
        n = self.cfg.num_blocks
        ids = {self.rng.randrange(n) for _ in range(self.rng.randint(1, 4))}
        self.both("evict_blocks", ids)
        self.stats.bump("evict_blocks")

    def reset(self) -> None:
        if self.rng.random() < 0.6:
            for rid in list(self.reqs):
                self.finish(rid, "reverse")
        ok = self.both("reset_prefix_cache")
        self.stats.bump("reset accepted" if ok else "reset refused")

    # ------------------------------------------------------------ run

    def run(self, ops: int) -> RunStats:
        rng = self.rng
        self.compare()
        for _ in range(ops):
            self.perform(
                rng.random(),
                [
                    (0.35 if self.reqs else 1.0, "admit", self.admit),
                    (0.7, "decode", self.decode),
                    (0.95, "finish", lambda: self.finish(rng.choice(list(self.reqs)))),
                    (0.98, "evict", self.evict),
                    (1.0, "reset", self.reset),
                ],
            )
            self.compare()
            bp.check_invariants(self.o)
            self.stats.ops += 1
        return self.stats
