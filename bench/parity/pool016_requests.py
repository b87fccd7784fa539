"""Request traffic on vLLM 0.16.0's BlockPool and ours, as a KV-cache manager
drives a pool: prompts (shared documents, LoRA, cache salt, multimodal
inputs, prompt embeddings), admission with the prefix lookup, touch,
allocation and caching, decode, frees in several orders, sliding-window
nulls and caching an already cached range again.
"""

from __future__ import annotations

from typing import Any

import torch

from .pool016_pair import Config, PoolPair, Req

VOCAB = 1000


class RequestTraffic(PoolPair):
    def __init__(self, cfg: Config, seed: int) -> None:
        super().__init__(cfg, seed)
        rng = self.rng
        hb = cfg.hash_block_size
        self.docs = [
            [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12) * hb * 3)] for _ in range(8)
        ]
        self.prompts: list[tuple[list[int], Any, Any, Any, Any]] = []
        self.next_id = 0

    def new_prompt(self) -> tuple[list[int], Any, Any, Any, Any]:
        rng = self.rng
        if self.prompts and rng.random() < 0.2:
            return rng.choice(self.prompts)
        tokens = list(rng.choice(self.docs)) if rng.random() < 0.85 else []
        if tokens and rng.random() < 0.5:
            tokens = tokens[: rng.randint(1, len(tokens))]
        tokens += [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
        lora = rng.choice([("sql", 3), ("chat", 9)]) if rng.random() < 0.12 else None
        salt = rng.choice(["tenant-a", "tenant-b"]) if rng.random() < 0.06 else None
        mm: list[tuple[str, int, int]] = []
        if rng.random() < 0.1:
            off = rng.randrange(len(tokens))
            while off < len(tokens) and len(mm) < 3:
                n = rng.randint(1, 9)
                mm.append((f"img{rng.randrange(4)}", off, n))
                off += n + rng.randint(0, 6)
        emb = None
        if rng.random() < 0.06:  # prompt embeddings: a few distinct tensors
            gen = torch.Generator().manual_seed(rng.randrange(3))
            dtype = rng.choice([torch.float16, torch.bfloat16, torch.float32])
            emb = torch.randn(len(tokens), 4, generator=gen).to(dtype)
        prompt = (tokens, lora, salt, mm, emb)
        self.prompts.append(prompt)
        return prompt

    def prefix_hits(self, r: Req, ntok: int) -> list[list[int]]:
        """The prefix lookup, as the KV-cache manager does it: the cached
        blocks per group (all groups at once where their block sizes agree)."""
        cfg = self.cfg
        hits: list[list[int]] = [[] for _ in cfg.groups]
        if cfg.uniform:
            bs = cfg.groups[0][1]
            hv = self.view(r.sides[0].block_hashes, bs)
            gids = [g for g, _ in cfg.groups]
            for i in range(min((ntok - 1) // bs, len(hv))):
                got = self.cached_ids(hv[i], gids)
                if got is None:
                    break
                for j, bid in enumerate(got):
                    hits[j].append(bid)
        else:
            for j, (gid, bs) in enumerate(cfg.groups):
                hv = self.view(r.sides[0].block_hashes, bs)
                for i in range(min((ntok - 1) // bs, len(hv))):
                    got = self.cached_ids(hv[i], [gid])
                    if got is None:
                        break
                    hits[j].append(got[0])
        return hits

    def admit(self) -> None:
        rng, cfg = self.rng, self.cfg
        tokens, lora, salt, mm, emb = self.new_prompt()
        rid = f"r{self.next_id}"
        self.next_id += 1
        if emb is not None:
            self.stats.bump("admit prompt embeds")
        sides = (
            self.v.make_request(rid, tokens, lora, salt, mm, emb),
            self.o.make_request(rid, tokens, lora, salt, mm, emb),
        )
        r = Req(rid, sides, [[] for _ in cfg.groups], [0] * len(cfg.groups))
        self.check_hashes(r)
        skip_cache = rng.random() < 0.15  # e.g. prompt logprobs: no prefix hit
        sparse = rng.random() < 0.08  # sliding-window style: leading null blocks
        ntok = len(tokens)

        if not skip_cache and not sparse:
            hits = self.prefix_hits(r, ntok)
        else:
            hits = [[] for _ in cfg.groups]
        need = 0
        nulls = []
        for j, (_, bs) in enumerate(cfg.groups):
            total = -(-ntok // bs)
            k = rng.randint(1, max(total - 1, 1)) if sparse and total > 1 else 0
            nulls.append(k)
            need += total - len(hits[j]) - k
        evictable = {b for t in hits for b in t if self.o.pool.blocks[b].ref_cnt == 0}
        if need + len(evictable) > self.free_count():
            self.stats.bump("admit refused")
            if self.reqs:
                self.finish(self.reqs.pop(), "reverse")  # preempt the newest
            return
        for j in range(len(cfg.groups)):
            self.touch(hits[j])
            self.stats.hits += len(hits[j])
        for j, (_, bs) in enumerate(cfg.groups):
            total = -(-ntok // bs)
            new = self.new_blocks(total - len(hits[j]) - nulls[j])
            r.tables[j] = hits[j] + [0] * nulls[j] + new
            full = ntok // bs
            start = len(hits[j])
            self.cache_full(r, j, start, full)
            r.cached[j] = max(full, start)
        self.reqs.append(r)
        self.stats.bump(
            "admit" + (" no-cache" if skip_cache else "") + (" sparse" if sparse else "")
        )

    def decode(self) -> None:
        rng, cfg = self.rng, self.cfg
        r = rng.choice(self.reqs)
        new = [rng.randrange(VOCAB) for _ in range(rng.choice([1, 1, 2, 3, 7]))]
        ntok = r.sides[1].num_tokens + len(new)
        need = sum(-(-ntok // bs) - len(r.tables[j]) for j, (_, bs) in enumerate(cfg.groups))
        if need > self.free_count():
            self.reqs.remove(r)
            self.finish(r, "reverse")  # preempted
            self.stats.bump("preempted")
            return
        for side_req in r.sides:
            side_req.append_output_token_ids(list(new))
        self.check_hashes(r)
        for j, (_, bs) in enumerate(cfg.groups):
            n = -(-ntok // bs) - len(r.tables[j])
            if n > 0:
                r.tables[j] += self.new_blocks(n)
            full = ntok // bs
            self.cache_full(r, j, r.cached[j], full)
            r.cached[j] = max(r.cached[j], full)
        self.stats.bump("decode")

    def finish(self, r: Req, order: str) -> None:
        rng = self.rng
        for j in range(len(self.cfg.groups)):
            ids = list(r.tables[j])
            if order == "reverse":
                ids.reverse()
            elif order == "shuffle":
                rng.shuffle(ids)
            self.both(lambda s, ids=ids: s.pool.free_blocks(self.table(s, ids)), "free_blocks")
        self.stats.bump(f"free {order}")

    def finish_op(self) -> None:
        rng = self.rng
        x = rng.random()
        pair = self._disjoint_pair() if x < 0.12 else None
        if pair is not None:
            # Two requests' reversed tables in one call (group by group).  Only
            # requests that share no block: vLLM 0.16 corrupts its free list
            # when one call lists a block twice and it reaches 0 (it appends
            # it twice); ours queues it once, at its last mention.
            a, b = pair
            self.reqs.remove(a)
            self.reqs.remove(b)
            for j in range(len(self.cfg.groups)):
                ids = a.tables[j][::-1] + b.tables[j][::-1]
                self.both(
                    lambda s, ids=ids: s.pool.free_blocks(iter(self.table(s, ids))),
                    "free_blocks",
                )
            self.stats.bump("free two tables")
            return
        r = self.reqs.pop(rng.randrange(len(self.reqs)))
        self.finish(r, "reverse" if x < 0.75 else "forward" if x < 0.88 else "shuffle")

    def _disjoint_pair(self) -> tuple[Req, Req] | None:
        if len(self.reqs) < 2:
            return None
        a, b = self.rng.sample(self.reqs, 2)
        ids_a = {i for t in a.tables for i in t if i}
        if any(i in ids_a for t in b.tables for i in t):
            return None
        return a, b

    def recache(self) -> None:
        """cache_full_blocks over an already cached range: an assertion on both
        sides, after the same partial work."""
        cands = [r for r in self.reqs if r.cached[0] > 0]
        if not cands:
            return
        r = self.rng.choice(cands)
        a = self.rng.randrange(r.cached[0])
        self.cache_full(r, 0, a, r.cached[0], "cache_full_blocks(again)")
        self.stats.bump("recache")

    def slide(self) -> None:
        """Sliding window: free a request's oldest blocks, null in their place."""
        cands = [r for r in self.reqs if any(b for b in r.tables[0][:-1])]
        if not cands:
            return
        r = self.rng.choice(cands)
        for j in range(len(self.cfg.groups)):
            t = r.tables[j]
            k = self.rng.randint(1, max(len(t) - 1, 1))
            gone = [b for b in t[:k] if b != 0]
            self.both(lambda s, g=gone: s.pool.free_blocks(self.blocks(s, g[::-1])), "free_blocks")
            t[:k] = [0] * k
        self.stats.bump("slide")
