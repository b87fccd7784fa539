"""The observer over real ZMQ sockets: recorded batches in both encodings
with gaps (replays served by a scripted publisher, racing live batches),
restarts, replay timeouts; several publishers feeding one fleet view; and
our own service joining an observer's fleet through its publisher."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from app.observer.fleet import Fleet
from app.observer.source import Source
from blockpool import KVCacheEvent
from blockpool.kvevents.config import KVEventsConfig, SourceSpec
from blockpool.kvevents.hashes import hash_hex
from blockpool.kvevents.publisher import KVEventPublisher
from tests.kvevents.helpers import (
    FakePublisher,
    Workload,
    as_bytes_truth,
    await_for,
    engine_copies,
    fake_publisher,
    free_port,
    map_tagged,
    positional,
    truth,
)
from tests.stream.live import http, live_server, random_traffic

ENCODE: dict[str, Callable[[list[KVCacheEvent]], bytes]] = {
    "positional": positional,
    "map-bytes": lambda evs: map_tagged(evs, as_bytes=True),
}


def spec_for(fp: FakePublisher, name: str = "fake", replay: bool = True) -> SourceSpec:
    return SourceSpec(name, fp.endpoint, fp.replay_endpoint if replay else None, 0)


@contextlib.asynccontextmanager
async def observing(fp: FakePublisher, **kw: Any) -> AsyncIterator[Source]:
    """A one-source fleet following ``fp``, its SUB connected and subscribed."""
    fleet = Fleet([Source(spec_for(fp), **kw)])
    await fleet.start()
    s = fleet.sources["fake"]
    try:
        await await_for(lambda: s.connected, what="the SUB to connect")
        await asyncio.to_thread(fp.wait_subscribed)
        yield s
    finally:
        await fleet.stop()


async def settled(s: Source, last: int, timeout: float = 15.0) -> None:
    t = s.tracker
    await await_for(
        lambda: t.applied == last and not t.replaying and not t.pending,
        timeout,
        f"{s.name} to apply up to seq {last} (at {t.applied}, replaying {t.replaying})",
    )
    s.state.check()


@pytest.mark.parametrize("enc", sorted(ENCODE))
def test_gaps_are_filled_by_replays_racing_live_batches(enc: str) -> None:
    w = Workload(seed=21)
    batches = w.batches(150)
    payloads = [ENCODE[enc](evs) for evs in batches]
    rng = random.Random(5)

    async def main() -> None:
        with fake_publisher() as fp:
            async with observing(fp) as s:
                # one publisher: seqs go out in order, whichever thread sends
                # (a seq sent twice or out of order would read as a restart)
                lock = threading.Lock()
                next_live = 0
                sent_during: list[int] = []

                def emit(during: bool) -> None:
                    nonlocal next_live
                    with lock:
                        i = next_live
                        if i >= len(payloads):
                            return
                        next_live += 1
                        if not during and rng.random() < 0.1:
                            fp.record(i, payloads[i])  # lost on the way
                        else:
                            fp.send(i, payloads[i])
                            if during:
                                sent_during.append(i)

                def race() -> None:
                    # while the replay is being served, later batches go out live
                    for _ in range(3):
                        emit(during=True)

                fp.during_replay = race
                while next_live < len(payloads):
                    emit(during=False)
                    if next_live % 10 == 0:
                        await asyncio.sleep(0.01)
                await settled(s, len(payloads) - 1)
                t = s.tracker
                want = truth(batches)
                assert s.state.copies() == (as_bytes_truth(want) if enc == "map-bytes" else want)
                assert t.exact and t.missed == 0 and t.replay_failures == 0, (
                    t.reason,
                    t.last_failure,
                    t.first_seq,
                    fp.requests,
                )
                assert t.gaps >= 1 and len(fp.requests) == t.replays
                assert sent_during  # replays really raced live batches
                assert s.encodings == {"positional" if enc == "positional" else "map": t.batches}
        w.check()

    asyncio.run(main())


def test_restart_and_replay_timeout_over_sockets() -> None:
    w1, w2 = Workload(seed=31), Workload(seed=32)
    old, new = w1.batches(40), w2.batches(30)

    async def main() -> None:
        with fake_publisher() as fp:
            async with observing(fp, replay_timeout=0.3, replay_backoff=0.0) as src:
                for i, evs in enumerate(old):
                    fp.send(i, positional(evs))
                await settled(src, len(old) - 1)
                assert src.state.copies() == truth(old) and src.tracker.exact
                # the publisher restarts: empty cache, seqs from 0 again
                fp.restart()
                for i, evs in enumerate(new):
                    fp.send(i, map_tagged(evs))
                await settled(src, len(new) - 1)
                t = src.tracker
                assert t.restarts == 1 and src.state.copies() == truth(new) and t.exact
                # a replay that never comes: given up, the buffered batches applied
                fp.serve_replays = False
                more = w2.batches(6)
                base = len(new)
                fp.record(base, positional(more[0]))
                for j in range(1, 6):
                    fp.send(base + j, positional(more[j]))
                await settled(src, base + 5)
                assert t.replay_failures == 1 and t.missed == 1 and not t.exact
                assert "no replay answer" in (t.last_failure or "")
                assert src.state.copies() == truth(new + more[1:])
        w1.check()
        w2.check()

    asyncio.run(main())


def test_joining_late_bootstraps_from_the_replay_buffer() -> None:
    w = Workload(seed=41)
    batches = w.batches(50)

    async def main() -> None:
        with fake_publisher() as fp:
            for i in range(40):  # published before the observer existed
                fp.record(i, positional(batches[i]))
            async with observing(fp) as s:
                for i in range(40, 50):
                    fp.send(i, positional(batches[i]))
                await settled(s, 49)
                assert fp.requests[0] == 0  # asked for the whole history
                assert s.tracker.exact and s.tracker.first_seq == 0
                assert s.state.copies() == truth(batches) == w.pool_copies()
        w.check()

    asyncio.run(main())


async def drained(srcs: list[Source], pubs: list[KVEventPublisher]) -> None:
    """Every batch queued was sent (or dropped, counted), and each source
    applied all of it.  (An empty queue is not enough: the publisher's
    thread may hold the last batch, taken off the queue but not yet sent --
    comparing then is what made this test fail on a loaded machine.)"""
    for s, p in zip(srcs, pubs, strict=True):
        await await_for(
            lambda p=p: p.counts.batches_published + p.counts.batches_dropped == p._next_seq,
            what="every queued batch to be sent",
        )
        assert p.counts.batches_dropped == 0, "a batch was dropped: a real loss"
        await settled(s, p.last_published_seq)


async def until_heard(
    srcs: list[Source], pubs: list[KVEventPublisher], ws: list[Workload], ts: float
) -> None:
    """A SUB misses what its PUB sent before the subscription reached it (the
    slow joiner); the source's bootstrap replay from seq 0 then fills that.
    If a source has heard nothing at all yet, publish more until it has."""
    while not all(s.tracker.received for s in srcs):
        for s, w, p in zip(srcs, ws, pubs, strict=True):
            if not s.tracker.received:
                evs = w.step()
                if evs:
                    p.publish_events(ts, evs)
        await asyncio.sleep(0.05)


def run_publishing(
    main: Callable[[], Coroutine[Any, Any, None]],
    pubs: list[KVEventPublisher],
    ws: list[Workload],
) -> None:
    """Run the test; stop the publishers whatever happens; audit the pools."""
    try:
        asyncio.run(main())
    finally:
        for p in pubs:
            p.stop()
    for w in ws:
        w.check()


def shared_workloads(n: int) -> list[Workload]:
    """Pools serving the same prompts (same prefixes) in different orders."""
    ws = [Workload(seed=50 + i, num_blocks=64, lora=False) for i in range(n)]
    for w in ws[1:]:
        w.prefixes = ws[0].prefixes
    return ws


def test_several_publishers_feed_one_fleet_view() -> None:
    ws = shared_workloads(3)
    cfg = KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    pubs = [KVEventPublisher(cfg) for _ in ws]
    for p in pubs:
        p.start()

    async def main() -> None:
        specs = [
            SourceSpec(f"vllm-{i}", p.bound_endpoint or "", p.bound_replay_endpoint, 0)
            for i, p in enumerate(pubs)
        ]
        fleet = Fleet([Source(sp) for sp in specs])
        await fleet.start()
        try:
            srcs = list(fleet.sources.values())
            await await_for(lambda: all(s.connected for s in srcs), what="every SUB to connect")
            for _ in range(80):
                for w, p in zip(ws, pubs, strict=True):
                    evs = w.step()
                    if evs:
                        p.publish_events(1.0, evs)
                await asyncio.sleep(0)
            await until_heard(srcs, pubs, ws, 1.0)
            await drained(srcs, pubs)
            for s, w in zip(srcs, ws, strict=True):
                assert s.state.copies() == w.pool_copies()
                assert s.tracker.exact
            # the router's question, per instance: leading blocks of a prompt
            hits = 0
            for prefix in ws[0].prefixes:
                tokens = [*prefix, 1, 2, 3, 4, 5, 6, 7, 8]
                by_tokens = fleet.lookup(tokens=tokens)
                for row in by_tokens["instances"]:
                    w = ws[int(row["instance"].split("-")[1])]
                    hashes = pool_prompt_hashes(w, tokens)
                    held = w.pool_copies()
                    lead = 0
                    for h in hashes:
                        if h not in held:
                            break
                        lead += 1
                    assert row["leading_blocks"] == lead, row
                    hits += lead > 0
                    # the same answer from the request's block hashes
                    if hashes:
                        by_hash = fleet.lookup(hashes=hashes)
                        same = next(
                            r for r in by_hash["instances"] if r["instance"] == row["instance"]
                        )
                        assert same["leading_blocks"] == lead
            assert hits > 3
            # families: every held block of every instance is counted once
            over = fleet.overview(limit=10_000)
            per: dict[str, int] = {}
            for fam in over["items"]:
                for inst in fam["instances"]:
                    per[inst["instance"]] = per.get(inst["instance"], 0) + inst["blocks"]
            assert per == {s.name: s.state.blocks for s in srcs if s.state.blocks}
        finally:
            await fleet.stop()

    run_publishing(main, pubs, ws)


def pool_prompt_hashes(w: Workload, tokens: list[int]) -> list[int]:
    """The 64-bit event hashes of a prompt's full blocks (no LoRA)."""
    req = w.manager.make_request("probe", tokens)
    return [int.from_bytes(bytes(h)[-8:], "big") for h in req.block_hashes]


def test_our_service_joins_the_fleet_and_the_observer_map_is_its_hash_map() -> None:
    async def main() -> None:
        async with live_server(
            num_blocks=200, kv_events_publisher=True,
            kv_events_endpoint="tcp://127.0.0.1:*", kv_events_replay_endpoint="tcp://127.0.0.1:*",
        ) as app:  # fmt: skip
            pub: KVEventPublisher = app.state.kv_publisher
            with fake_publisher() as fp:
                fleet = Fleet(
                    [
                        Source(SourceSpec("blockpool", pub.bound_endpoint or "",
                                          pub.bound_replay_endpoint, 0)),
                        Source(spec_for(fp, "sglang")),
                    ]
                )  # fmt: skip
                await fleet.start()
                try:
                    ours, other = fleet.sources["blockpool"], fleet.sources["sglang"]
                    await await_for(lambda: ours.connected and other.connected)
                    await asyncio.to_thread(fp.wait_subscribed)
                    w = Workload(seed=61)
                    other_batches = w.batches(30)
                    for i, evs in enumerate(other_batches):
                        fp.send(i, map_tagged(evs))
                    async with http(app) as h:
                        stats = await random_traffic(h, 400, seed=3)
                        assert stats["ok"] > 200
                        status = (await h.get("/api/kv-events")).json()
                        metrics = (await h.get("/metrics")).text
                    engine = app.state.engine
                    await await_for(lambda: pub.last_published_seq + 1 == pub._next_seq)
                    await settled(ours, pub.last_published_seq)
                    await settled(other, len(other_batches) - 1)
                    assert ours.state.copies() == engine_copies(engine)
                    assert ours.tracker.exact and ours.ranks_seen == {0}
                    assert other.state.copies() == truth(other_batches)
                    assert status["enabled"] and status["batches_published"] > 0
                    assert status["batches_dropped"] == 0
                    assert "blockpool_kvevents_batches_published_total" in metrics
                    # a prefix the service caches is found on it by the fleet view
                    some = next(iter(ours.state.entries))
                    found = fleet.lookup(hashes=[some])
                    assert found["best"][0] == "blockpool"
                    assert found["query"]["hashes"][-1] == hash_hex(some)
                    engine.check()
                finally:
                    await fleet.stop()
        w.check()

    asyncio.run(main())


def consecutive_ports(n: int) -> int:
    """A base port with the next n - 1 ports free too."""
    import socket

    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for k in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


def test_data_parallel_ranks_are_expanded_like_vllm_offsets_them() -> None:
    """Two DP ranks publishing on vLLM's offset ports, observed from one
    endpoint with --dp-size 2: each rank is its own pool."""
    from app.shared.settings import ObserverSettings

    pub_base, replay_base = consecutive_ports(2), consecutive_ports(2)
    ws = shared_workloads(2)
    pubs = [
        KVEventPublisher(
            KVEventsConfig(
                endpoint=f"tcp://127.0.0.1:{pub_base}",
                replay_endpoint=f"tcp://127.0.0.1:{replay_base}",
                data_parallel_rank=rank,
                bind="bind",
            )
        )
        for rank in range(2)
    ]
    for p in pubs:
        p.start()
    assert [p.bound_endpoint for p in pubs] == [
        f"tcp://127.0.0.1:{pub_base}",
        f"tcp://127.0.0.1:{pub_base + 1}",
    ]
    settings = ObserverSettings(
        endpoints=[f"engine=tcp://127.0.0.1:{pub_base}"],
        replay_endpoints=[f"tcp://127.0.0.1:{replay_base}"],
        dp_size=2,
    )

    async def main() -> None:
        fleet = Fleet([Source(spec) for spec in settings.sources()])
        await fleet.start()
        try:
            srcs = [fleet.sources["engine-dp0"], fleet.sources["engine-dp1"]]
            await await_for(lambda: all(s.connected for s in srcs))
            for _ in range(40):
                for w, p in zip(ws, pubs, strict=True):
                    evs = w.step()
                    if evs:
                        p.publish_events(2.0, evs)
            await until_heard(srcs, pubs, ws, 2.0)
            await drained(srcs, pubs)
            for rank, (s, w) in enumerate(zip(srcs, ws, strict=True)):
                assert s.ranks_seen == {rank}
                assert s.state.copies() == w.pool_copies() and s.tracker.exact
        finally:
            await fleet.stop()

    run_publishing(main, pubs, ws)
