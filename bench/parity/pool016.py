"""The run of vLLM 0.16.0's BlockPool against ours: the request traffic
(pool016_requests) mixed with the pool's other calls -- extra touches of
cached hits and their release, evict_blocks, lookups in any groups,
reset_prefix_cache, taking events (and their msgpack wire bytes), draining
metric samples, asking for too many blocks -- and the comparison after each.
"""

from __future__ import annotations

import msgspec
from vllm.distributed.kv_events import KVEventBatch as VKVEventBatch

import blockpool as bp

from .common import RunStats, event_view
from .pool016_pair import Config, sample_view
from .pool016_requests import RequestTraffic


class Driver(RequestTraffic):
    def __init__(self, cfg: Config, seed: int) -> None:
        super().__init__(cfg, seed)
        self.pins: list[list[int]] = []  # extra touches, per group 0

    def touch_extra(self) -> None:
        """Another hit on a cached block (e.g. a parallel sampling branch)."""
        keys = list(self.o.pool.cached_block_hash_to_block._cache)
        if not keys:
            return
        key = self.rng.choice(keys)
        got = self.cached_ids(bp.get_block_hash(key), [bp.get_group_id(key)])
        self.touch(got)
        self.pins.append(got)
        self.stats.bump("touch extra")

    def unpin(self) -> None:
        ids = self.pins.pop(self.rng.randrange(len(self.pins)))
        self.both(lambda s: s.pool.free_blocks(self.blocks(s, ids)), "free_blocks")
        self.stats.bump("unpin")

    def evict(self) -> None:
        rng, n = self.rng, self.cfg.num_blocks
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.3:
            ids.append(ids[0])  # repeated id
        if rng.random() < 0.15:
            ids.append(n + rng.randrange(3))  # out of range: an assertion on both
            self.stats.bump("evict out of range")
        self.both(lambda s: s.pool.evict_blocks(list(ids)), "evict_blocks")
        self.stats.bump("evict_blocks")

    def lookup(self) -> None:
        rng = self.rng
        keys = list(self.o.pool.cached_block_hash_to_block._cache)
        if keys and rng.random() < 0.7:
            h = bp.get_block_hash(rng.choice(keys))
        else:
            r = rng.choice(self.reqs) if self.reqs else None
            if r is None or not r.sides[0].block_hashes:
                return
            h = rng.choice(list(r.sides[0].block_hashes))
        known = [g for g, _ in self.cfg.groups]
        gids = [rng.choice(known) for _ in range(rng.randint(0, len(known) + 1))]
        if rng.random() < 0.2:
            gids.insert(rng.randint(0, len(gids)), 7)  # a group that holds nothing
        got = self.cached_ids(h, gids)
        self.stats.bump("lookup hit" if got else "lookup miss")

    def reset(self, drain: bool) -> None:
        if drain:
            while self.reqs:
                self.finish(self.reqs.pop(), "reverse")
            while self.pins:
                self.unpin()
        ok = self.both(lambda s: s.pool.reset_prefix_cache(), "reset_prefix_cache")
        self.stats.bump("reset accepted" if ok else "reset refused")

    def take_events(self) -> None:
        taken = self.both(lambda s: [event_view(e) for e in s.pool.take_events()], "take_events")
        self.seen_events = 0
        self.stats.events += len(taken)
        self.stats.bump("take_events")

    def wire(self) -> None:
        """The msgpack bytes of a batch must be equal."""
        vev = self.v.pool.take_events()
        oev = self.o.pool.take_events()
        self.seen_events = 0
        if [event_view(e) for e in vev] != [event_view(e) for e in oev]:
            self.fail("taken events differ")
        rank = self.rng.choice([None, 0, 3])
        vbytes = msgspec.msgpack.Encoder().encode(
            VKVEventBatch(ts=12.5, events=vev, data_parallel_rank=rank)
        )
        obytes = bp.encode_event_batch(
            bp.KVEventBatch(ts=12.5, events=oev, data_parallel_rank=rank)
        )
        if vbytes != obytes:
            self.fail("event batch wire bytes differ")
        back = bp.decode_event_batch(vbytes)
        if [event_view(e) for e in back.events] != [event_view(e) for e in oev]:
            self.fail("our decoder does not read vLLM's batch back")
        self.stats.events += len(vev)
        self.stats.bump("wire")

    def drain_metrics(self) -> None:
        got = self.both(lambda s: [sample_view(e) for e in s.mc.drain_events()], "drain_events")
        self.stats.samples += len(got)
        self.stats.bump("drain metrics")

    def too_many(self) -> None:
        n = self.o.pool.get_num_free_blocks() + self.rng.randint(1, 3)
        self.both(lambda s: s.pool.get_new_blocks(n), "get_new_blocks(too many)")
        self.stats.bump("get_new_blocks too many")

    def get_usage(self) -> None:
        self.both(lambda s: s.pool.get_usage(), "get_usage")

    # -------------------------------------------------------------- run

    def step(self) -> None:
        rng = self.rng
        self.clock.now += rng.randint(1, 5_000_000)
        self.perform(
            rng.random(),
            [
                (0.27 if self.reqs else 1.0, "admit", self.admit),
                (0.55, "decode", self.decode),
                (0.70, "finish", self.finish_op),
                (0.74, "touch", self.touch_extra),
                (0.77 if self.pins else 0.0, "unpin", self.unpin),
                (0.81, "evict", self.evict),
                (0.85, "lookup", self.lookup),
                (0.865, "reset", lambda: self.reset(drain=False)),
                (0.872, "drain+reset", lambda: self.reset(drain=True)),
                (0.90, "take_events", self.take_events),
                (0.92, "wire", self.wire),
                (0.94, "drain metrics", self.drain_metrics),
                (0.95, "too many", self.too_many),
                (0.96, "recache", self.recache),
                (0.975, "slide", self.slide),
                (1.0, "get_usage", self.get_usage),
            ],
        )
        self.compare()
        self.stats.ops += 1

    def run(self, ops: int) -> RunStats:
        self.compare()
        for _ in range(ops):
            self.step()
        self.op = "final drain"
        self.reset(drain=True)
        self.wire()
        self.drain_metrics()
        self.compare()
        return self.stats
