"""A seeded soak of random request traffic through RequestManager.

Requests share system prompts and documents (Zipf-weighted), repeat earlier
prompts, carry LoRA names and cache salts now and then, decode token by
token, finish, and are refused or preempted when the pool is full.  Every
``check_every`` operations the pool's invariants are checked, and so is the
manager's view (ref counts = uses by running requests, table sizes, cached
hashes), and a consumer's mirror of the prefix cache built only from the KV
events must equal the pool's hash map.  Each admission's hit length is also
recomputed from that mirror.

    python -m tests.blockpool.soak --ops 2000000 --seed 1

The test suite (tests/blockpool/test_soak.py) runs a short version.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence

from blockpool import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVCacheMetricsCollector,
    NotEnoughBlocksError,
    RequestManager,
    check_invariants,
    init_none_hash,
    sha256,
)

VOCAB = 32_000


class SoakStats(Counter[str]):
    """The soak's tallies by name: ops, admitted, refused, appended,
    preempted, finished, evict_calls, resets, resets_refused, checks,
    hit_tokens, query_tokens, stored_events, removed_events, metric_samples,
    and peak_running (a maximum, not a sum)."""

    def summary(self) -> str:
        rate = self["hit_tokens"] / self["query_tokens"] if self["query_tokens"] else 0.0
        ops = (
            "{ops} ops: {admitted} admitted ({refused} refused), {appended} appends, "
            "{finished} finished, {preempted} preempted, {evict_calls} evict_blocks, "
            "{resets} resets ({resets_refused} refused)"
        )
        seen = (
            "{stored_events} BlockStored, {removed_events} BlockRemoved; "
            "{metric_samples} metric samples; peak running {peak_running}; {checks} full checks"
        )
        return f"{ops.format_map(self)}; hit rate {rate:.1%}; {seen.format_map(self)}"


class SoakFailure(AssertionError):
    pass


class Soak:
    def __init__(
        self,
        seed: int,
        num_blocks: int = 512,
        block_size: int = 4,
        groups: int = 1,
        max_running: int = 40,
        strict: bool = True,
    ) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.bs = block_size
        self.mc = KVCacheMetricsCollector(0.05, rng=random.Random(seed + 1).random)
        self.pool = BlockPool(
            num_blocks,
            enable_caching=True,
            hash_block_size=block_size,
            enable_kv_cache_events=True,
            metrics_collector=self.mc,
            strict=strict,
        )
        self.group_ids = list(range(groups))
        self.mgr = RequestManager(self.pool, group_ids=self.group_ids)
        self.max_running = max_running
        rng = self.rng
        self.docs = [
            [rng.randrange(VOCAB) for _ in range(rng.randint(2, 30) * block_size)]
            for _ in range(12)
        ]
        self.weights = [1.0 / (i + 1) for i in range(len(self.docs))]
        self.prompts: list[tuple[list[int], str | None, str | None]] = []
        self.mirror: Counter[int] = Counter()  # event consumer: int hash -> copies
        self.next_id = 0
        self.stats = SoakStats()

    # ------------------------------------------------------------ traffic

    def _prompt(self) -> tuple[list[int], str | None, str | None]:
        rng = self.rng
        if self.prompts and rng.random() < 0.2:
            return rng.choice(self.prompts)
        tokens: list[int] = []
        if rng.random() < 0.85:
            tokens += rng.choices(self.docs, self.weights)[0]
            if rng.random() < 0.3:
                tokens += rng.choice(self.docs)
        tokens += [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
        lora = "lora-a" if rng.random() < 0.1 else None
        salt = "tenant-x" if rng.random() < 0.05 else None
        prompt = (tokens, lora, salt)
        self.prompts.append(prompt)
        if len(self.prompts) > 200:
            self.prompts.pop(0)
        return prompt

    def _expected_hit_blocks(self, tokens: list[int], lora: str | None, salt: str | None) -> int:
        """Leading full blocks whose hash the event stream says is cached."""
        if len(self.group_ids) > 1:
            return -1  # events carry no group: not decidable from the mirror
        req = self.mgr.make_request("?", tokens, lora_name=lora, cache_salt=salt)
        limit = (len(tokens) - 1) // self.bs
        n = 0
        for h in req.block_hashes[:limit]:
            if self.mirror[int.from_bytes(h[-8:], "big")] <= 0:
                break
            n += 1
        return n

    def step(self) -> None:
        rng, mgr, st = self.rng, self.mgr, self.stats
        running = list(mgr.requests)
        r = rng.random()
        if (r < 0.33 and len(running) < self.max_running) or not running:
            tokens, lora, salt = self._prompt()
            rid = f"r{self.next_id}"
            self.next_id += 1
            expected = self._expected_hit_blocks(tokens, lora, salt)
            try:
                adm = mgr.admit(rid, tokens, lora_name=lora, cache_salt=salt)
            except NotEnoughBlocksError:
                st["refused"] += 1
                if running:  # make room, as a scheduler would
                    mgr.finish(rng.choice(running))
                    st["preempted"] += 1
            else:
                if expected >= 0 and adm.num_hit_blocks != expected:
                    raise SoakFailure(
                        f"{rid}: {adm.num_hit_blocks} hit blocks, events say {expected}"
                    )
                st["admitted"] += 1
                st["query_tokens"] += len(tokens)
                st["hit_tokens"] += adm.num_computed_tokens
                st["peak_running"] = max(st["peak_running"], len(mgr.requests))
        elif r < 0.80:
            rid = rng.choice(running)
            new = [rng.randrange(VOCAB) for _ in range(rng.choice((1, 1, 1, 2, 5, 9)))]
            try:
                mgr.append_tokens(rid, new)
            except NotEnoughBlocksError:
                mgr.finish(rid)  # preempted
                st["preempted"] += 1
            else:
                st["appended"] += 1
        elif r < 0.985:
            mgr.finish(rng.choice(running))
            st["finished"] += 1
        elif r < 0.995:
            n = self.pool.num_gpu_blocks
            self.pool.evict_blocks({rng.randrange(n) for _ in range(rng.randint(1, 8))})
            st["evict_calls"] += 1
        else:
            if rng.random() < 0.5:  # drain: everything finishes, then reset
                for rid in running:
                    mgr.finish(rid)
                st["finished"] += len(running)
            ok = self.pool.reset_prefix_cache()
            if ok != (not mgr.requests):
                raise SoakFailure(f"reset returned {ok} with {len(mgr.requests)} running")
            if ok:
                st["resets"] += 1
            else:
                st["resets_refused"] += 1
        self._consume_events()
        st["metric_samples"] += len(self.mc.drain_events())
        st["ops"] += 1

    def _consume_events(self) -> None:
        mirror = self.mirror
        for ev in self.pool.take_events():
            if isinstance(ev, BlockStored):
                self.stats["stored_events"] += 1
                for h in ev.block_hashes:
                    mirror[h] += 1  # type: ignore[index]
            elif isinstance(ev, BlockRemoved):
                self.stats["removed_events"] += 1
                for h in ev.block_hashes:
                    if mirror[h] <= 0:  # type: ignore[index]
                        raise SoakFailure(f"BlockRemoved for {h} which was never stored")
                    mirror[h] -= 1  # type: ignore[index]
                    if not mirror[h]:  # type: ignore[index]
                        del mirror[h]  # type: ignore[arg-type]
            elif isinstance(ev, AllBlocksCleared):
                mirror.clear()

    # ------------------------------------------------------------- checks

    def check(self) -> None:
        pool, mgr = self.pool, self.mgr
        check_invariants(pool)
        uses: Counter[int] = Counter()
        for rid, req in mgr.requests.items():
            need = -(-req.num_tokens // self.bs)
            hashes = req.request.block_hashes
            for gid, table in zip(self.group_ids, req.block_tables, strict=True):
                if len(table) != need:
                    raise SoakFailure(f"{rid}: {len(table)} blocks for {req.num_tokens} tokens")
                for i, b in enumerate(table):
                    uses[b.block_id] += 1
                    key = b.block_hash
                    if key is not None and key != hashes[i] + gid.to_bytes(4, "big"):
                        raise SoakFailure(f"{rid}: block {b.block_id} caches another hash")
        refs = {b.block_id: b.ref_cnt for b in pool.blocks[1:] if b.ref_cnt}
        if refs != dict(uses):
            raise SoakFailure("ref counts differ from the running requests' block tables")
        if pool.get_num_free_blocks() != pool.num_gpu_blocks - 1 - len(uses):
            raise SoakFailure("free count differs from the blocks no request holds")
        in_map: Counter[int] = Counter()
        for key, entry in pool.cached_block_hash_to_block._cache.items():
            in_map[int.from_bytes(key[-12:-4], "big")] += (
                len(entry) if isinstance(entry, dict) else 1
            )
        if in_map != self.mirror:
            raise SoakFailure("the event consumer's mirror differs from the hash map")
        self.stats["checks"] += 1

    def run(self, ops: int, check_every: int = 200, progress: bool = False) -> SoakStats:
        start = time.perf_counter()
        tick = max(ops // 10, 1)
        for i in range(ops):
            try:
                self.step()
                if (i + 1) % check_every == 0:
                    self.check()
            except AssertionError as e:
                raise SoakFailure(f"seed {self.seed}, op {i}: {e}") from e
            if progress and (i + 1) % tick == 0:
                rate = (i + 1) / (time.perf_counter() - start)
                print(f"  {i + 1:>10} ops  {rate:,.0f} ops/s  {self.stats.summary()}", flush=True)
        for rid in list(self.mgr.requests):
            self.mgr.finish(rid)
        self._consume_events()
        self.check()
        return self.stats


def run_soak(ops: int, seed: int, check_every: int = 200, **kw: object) -> SoakStats:
    return Soak(seed, **kw).run(ops, check_every)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ops", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--blocks", type=int, default=768)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--check-every", type=int, default=1000)
    p.add_argument("--no-strict", action="store_true", help="vLLM's unchecked pool")
    args = p.parse_args(argv)
    init_none_hash(sha256, seed="0")
    log = logging.getLogger("blockpool")
    level = log.level
    log.setLevel(logging.ERROR)  # refused resets warn; the summary counts them
    soak = Soak(
        args.seed,
        num_blocks=args.blocks,
        block_size=args.block_size,
        groups=args.groups,
        max_running=args.max_running,
        strict=not args.no_strict,
    )
    print(f"soak: seed {args.seed}, {args.ops} ops, {args.blocks} blocks", flush=True)
    t0 = time.perf_counter()
    try:
        stats = soak.run(args.ops, args.check_every, progress=True)
    except SoakFailure as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        log.setLevel(level)
    print(f"ok in {time.perf_counter() - t0:.1f}s: {stats.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
