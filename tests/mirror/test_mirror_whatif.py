"""What-if on a mirror: the shadows are fed from the engine's request
records (hash chains and lengths) in the engine's free order, and answer
as ``blockpool trace`` does on the same requests (read from the mirror's
own ``GET /api/mirror/trace``) at 1x, 2x and 4x; at 1x they equal the
engine's own prefix-cache hits."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from blockpool.mirror.protocol import Arrive, Finished, Scheduled
from blockpool.runtime import ops
from tests.app.conftest import running
from tests.mirror.rig import Rig, until
from tests.mirror.workload import BLOCK, FollowedEngine

pytestmark = pytest.mark.anyio

NUM_BLOCKS = 33  # 32 usable: prompts of up to 9 blocks, evicting all along
FACTORS = (1.0, 2.0, 4.0)


def serve_one(engine: FollowedEngine, prompt: list[int], output: int) -> int:
    """One request alone, as the plugin tells it: arrival and first
    scheduling in one step, decode, then its finish in the next; its hit
    blocks."""
    rt, f = engine.rt, engine.follower
    got = rt.apply(ops.AdmitOp(token_ids=prompt))
    rid = got["request_id"]
    hashes = [bytes(h) for h in rt.manager.requests[rid].block_hashes]
    now = time.time()
    f.request(Arrive(rid, now, len(prompt), hashes))
    f.request(Scheduled(rid, now, got["num_hit_blocks"] * BLOCK))
    f.flush()
    if output:
        rt.apply(ops.AppendOp(request_id=rid, token_ids=[7] * output))
    n = rt.manager.requests[rid].num_tokens
    rt.apply(ops.FinishOp(request_id=rid))
    f.request(Finished(rid, time.time(), n))
    f.flush()
    return int(got["num_hit_blocks"])


def serial_traffic(engine: FollowedEngine, n: int, seed: int = 3) -> int:
    """``n`` prefix-sharing requests one after the other (a few long shared
    prefixes, random tails); the engine's hit blocks in all."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(10_000) for _ in range(BLOCK * k)] for k in (2, 3, 5, 6, 8)]
    hits = 0
    for _ in range(n):
        tail = [rng.randrange(10_000) for _ in range(rng.randrange(1, 3 * BLOCK))]
        # decode that fills no block: the planner's sequence mode counts prompt blocks only
        hits += serve_one(engine, rng.choice(prefixes) + tail, 0)
    return hits


def planner(path: Path, capsys: pytest.CaptureFixture[str], blocks: list[int]) -> list[Any]:
    argv = ["trace", str(path), "--block-size", str(BLOCK), "--free-order", "uncached_first"]
    argv += ["--capacity-blocks", ",".join(map(str, blocks)), "--json", "--no-progress"]
    capsys.readouterr()
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    return list(doc["results"])


@pytest.mark.parametrize("shadow_mode", ["inline", "process"])
async def test_shadows_on_a_mirror_equal_the_planner_and_the_engine(
    shadow_mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = Rig("uncached_first", num_blocks=NUM_BLOCKS)
    rig.start()
    try:
        engine = rig.engine
        hello = await rig.hello()
        app, client = rig.service(
            hello, analysis_mode="inline", shadow_mode=shadow_mode, shadow_factors=[2.0, 4.0]
        )
        mine = app.state.engine
        async with running(app) as api:
            await until(lambda: rig.caught_up(client))
            # the engine idle: its beat starts the feed from its counters
            feed = client.what_if
            assert feed is not None
            await until(lambda: feed.started)
            base = engine.stats()
            n = 120
            hits = serial_traffic(engine, n)
            await until(lambda: rig.caught_up(client) and feed.finished >= n)
            feeder = mine.analysis.mirror_shadows.feeder
            await until(lambda: feeder.latest and feeder.latest[0]["requests"] >= n)
            if shadow_mode == "process":
                assert feeder.wait_idle(60)
            # the span's end: the engine's counters, once the shadows saw every access
            now = engine.stats()
            await until(lambda: feeder.latest_real == (now[1], now[2]))

            view = await api.ok("GET", "/api/shadows")
            fed = view["fed"]
            assert fed["free_order"] == "uncached_first" and fed["requests_fed"] == n
            assert (
                fed["text"]
                == f"fed from {n} mirrored requests' hash chains, free order uncached_first"
            )
            rows = {(r["policy"], r["factor"]): r for r in view["shadows"]}
            one = rows[("uncached_first", 1.0)]
            assert one["capacity"] == NUM_BLOCKS - 1
            # 1x: the engine's own prefix-cache hits, over the span the shadows saw
            real = engine.stats()
            assert one["queries"] == real[1] - base[1]
            assert one["hits"] == real[2] - base[2] == hits * BLOCK
            assert view["real"]["span"]["hits_tokens"] == one["hits"]
            assert one["evictions"] > 0  # the pool was full: eviction decided hits

            # the planner on the mirror's own traffic, at the same sizes
            r = await api.get("/api/mirror/trace")
            assert r.status_code == 200
            path = tmp_path / "traffic.jsonl"
            path.write_text(r.text)
            head = json.loads(r.text.splitlines()[0])
            assert (
                head["tokens_per_id"] == BLOCK and head["engine"]["free_order"] == "uncached_first"
            )
            sizes = [round((NUM_BLOCKS - 1) * f) for f in FACTORS]
            got = planner(path, capsys, [s + 1 for s in sizes])
            assert len(got) == 3
            for f, size, res in zip(FACTORS, sizes, got, strict=True):
                shadow = rows[("uncached_first", f)]
                assert shadow["capacity"] == size
                assert res["hit_tokens"] == shadow["hits"], f"at {f}x"
                assert res["evictions"] == shadow["evictions"], f"at {f}x"
            # more room, more hits (the check is not vacuous)
            assert rows[("uncached_first", 4.0)]["hits"] > one["hits"]

            # the stream's analysis section says how they were fed
            sec = mine.analysis.stream_section()
            assert sec["shadow_fed"] == fed["text"]
            assert [s[0] for s in sec["shadows"]] == [s["name"] for s in view["shadows"]]
            feeder.check()
        mine.check()
        engine.rt.check()
    finally:
        rig.close()


async def test_requests_that_skip_the_cache_or_came_before_are_not_fed() -> None:
    """A request that skips the prefix cache, and one first scheduled before
    the feed began, are counted and never reach the shadows."""
    from blockpool.analysis.feeder import ShadowFeeder, ShadowLayout
    from blockpool.mirror.shadow_feed import MirrorShadowFeed
    from blockpool.shadow import ShadowSpec

    layout = ShadowLayout([ShadowSpec("uncached_first", 1.0)], 8, BLOCK, 1)
    feeder = ShadowFeeder(layout)
    feed = MirrorShadowFeed(feeder, "uncached_first")
    h = [b"a" * 32, b"b" * 32]
    feed.apply([Arrive("early", 0.0, 9, h), Scheduled("early", 0.0, 0)], (1, 9, 0))
    feed.apply(
        [
            Arrive("skip", 1.0, 9, h, True),
            Scheduled("skip", 1.0, 0),
            Scheduled("never-arrived", 1.0, 0),
            Arrive("ok", 1.0, 9, h),
            Scheduled("ok", 1.0, 0),
        ],
        (3, 27, 0),
    )
    feed.apply([Finished("ok", 2.0, 10), Finished("early", 2.0, 10)], (3, 27, 0))
    feeder.flush((27, 0))
    d = feed.describe()
    assert d["requests_fed"] == 1 and d["requests_finished"] == 1
    assert d["not_fed"] == {"skips_cache": 1, "not_heard": 2, "forgotten": 0}
    stats = feeder.latest
    assert stats is not None and stats[0]["requests"] == 1 and stats[0]["queries"] == 9
    assert feeder.real_base == (9, 0)
    feeder.check()

    # the engine's very first batch (seq 1): nothing came before, all is fed
    first = ShadowFeeder(layout)
    feed = MirrorShadowFeed(first, "uncached_first")
    feed.apply([Arrive("a", 0.0, 9, h), Scheduled("a", 0.0, 0)], (1, 9, 0), seq=1)
    first.flush((9, 0))
    assert feed.fed == 1 and feed.not_heard == 0 and first.real_base == (0, 0)
    # a beat before any batch: the feed starts from the engine's counters then
    third = ShadowFeeder(layout)
    feed = MirrorShadowFeed(third, "uncached_first")
    feed.begin((4, 40, 8))
    feed.apply([Arrive("b", 0.0, 9, h), Scheduled("b", 0.0, 0)], (5, 49, 8), seq=7)
    assert feed.fed == 1 and third.real_base == (40, 8)
    first.check()
    third.check()
