"""``serve --mirror``: an engine's request, as the plugin tells of it, has
the request story of the service's own (hit blocks, hashes, block ids,
timeline, a finished one, an unknown id refused)."""

from __future__ import annotations

import time

import anyio
import pytest

from blockpool.mirror import pool_digest
from blockpool.mirror.protocol import REQ_PREEMPTED
from tests.app.conftest import assert_error, running
from tests.mirror.rig import Rig, until
from tests.mirror.workload import BLOCK

pytestmark = pytest.mark.anyio


async def test_an_engine_requests_story_is_the_request_story(rig: Rig) -> None:
    engine = rig.engine
    engine.tell_requests = True
    hello = await rig.hello()
    app, client = rig.service(hello)
    mine = app.state.engine

    async with running(app) as api:
        await until(lambda: rig.caught_up(client))
        known_before = set(engine.rt.manager.requests)
        for _ in range(30):
            engine.drive(2)
            await anyio.sleep(0)
        # one running request is preempted (the plugin says so as it frees it)
        running_now = [r for r in engine.rt.manager.requests if r not in known_before]
        assert running_now
        rid = running_now[0]
        managed = engine.rt.manager.requests[rid]
        engine.follower.request([REQ_PREEMPTED, rid, time.time(), managed.num_tokens])
        engine.follower.flush()
        await until(lambda: rig.caught_up(client))
        await until(lambda: client.book.requests.get(rid, {}).get("preemptions") == 1)
        assert pool_digest(mine.pool) == pool_digest(engine.rt.pool)

        s = await api.ok("GET", f"/api/requests/{rid}/story")
        assert s["request_id"] == rid and s["state"] == "running"
        assert s["num_prompt_tokens"] == managed.request.num_prompt_tokens
        assert s["num_hit_blocks"] == managed.num_hit_blocks
        assert s["hit_tokens"] == s["num_hit_blocks"] * BLOCK
        assert s["preemptions"] == 1 and s["sources"]["engine"]
        assert s["sources"]["miss_reasons"]
        assert sum(s["misses"].values()) == len(s["blocks"]) - s["num_hit_blocks"]
        hashes = [f"{int.from_bytes(bytes(h)[-8:], 'big'):016x}" for h in managed.block_hashes]
        prompt_blocks = -(-managed.request.num_prompt_tokens // BLOCK)
        assert len(s["blocks"]) == prompt_blocks
        full = managed.request.num_prompt_tokens // BLOCK  # the hashed prompt blocks
        assert [b["hash"] for b in s["blocks"]] == hashes[:full] + [None] * (prompt_blocks - full)
        assert [b["hit"] for b in s["blocks"]].count(True) == s["num_hit_blocks"]
        # each hashed block: a block of the mirror's pool holding that hash now,
        # as the engine's does (the request's own block where it alone holds it)
        table = managed.block_tables[0]
        checked = 0
        for b, own in zip(s["blocks"], table, strict=False):
            if b["hash"] is None:
                continue
            checked += 1
            (bid,) = b["block_ids"]
            held = mine.pool.blocks[bid].block_hash
            assert (
                held is not None
                and f"{int.from_bytes(bytes(held)[-12:-4], 'big'):016x}" == (b["hash"])
            )
            assert engine.rt.pool.blocks[bid].block_hash == held
            if own.block_hash == held:
                holders = engine.rt.pool.cached_block_hash_to_block._cache[held]
                assert bid == own.block_id or isinstance(holders, dict)
        assert checked >= 3  # every prompt starts with a 3-block shared prefix
        assert [x["op"] for x in s["timeline"]] == ["arrive", "schedule", "preempt"]
        assert s["times"]["first_attempt_at"] == s["timeline"][0]["ts"]

        # a finished request: its state, total tokens and the finish in its timeline
        done = next(
            r
            for r, rec in client.book.requests.items()
            if rec["finished"] is not None and rec["prompt_tokens"] is not None
        )
        s = await api.ok("GET", f"/api/requests/{done}/story")
        assert s["state"] == "finished" and s["timeline"][-1]["op"] == "finish"
        assert s["num_tokens"] == client.book.requests[done]["num_tokens"]
        assert s["times"]["finished_at"] == s["timeline"][-1]["ts"]

        # an id the engine never told of: the one error shape, nothing changed
        before = pool_digest(mine.pool)
        r = await api.get("/api/requests/no-such-request/story")
        assert_error(r, 404, "not_found")
        assert "told of no request" in r.json()["error"]["message"]
        assert pool_digest(mine.pool) == before
    mine.check()
    engine.rt.check()
