"""``serve --mirror``: a request's story by the id the client got back.

vLLM (>= 0.11) hands the engine ``{client id}[-{prompt}]-{8 hex}`` and, with
``n`` > 1, one request per sample, ``{k}_`` before that: the story answers
the client's id with the first of them and names them all (``engine_ids``);
an id that only starts like another's is not taken for it."""

from __future__ import annotations

import time

import anyio
import pytest

from blockpool.mirror import pool_digest
from blockpool.mirror.protocol import Arrive, Finished, Scheduled
from tests.app.conftest import assert_error, running
from tests.mirror.rig import Rig, until
from tests.mirror.workload import BLOCK

pytestmark = pytest.mark.anyio


async def test_a_story_by_the_clients_id(rig: Rig) -> None:
    engine = rig.engine
    engine.tell_requests = True
    hello = await rig.hello()
    app, client = rig.service(hello)
    mine = app.state.engine
    async with running(app) as api:
        await rig.drive(client, 5, 4)
        # a prompt's hashes as the engine hashed them (a request it ran)
        rid0 = next(iter(engine.rt.manager.requests))
        hashes = [bytes(h) for h in engine.rt.manager.requests[rid0].block_hashes]
        n = len(hashes) * BLOCK + 1
        told = {
            "cmpl-7f3e-0-a7acb6a5": 2 * BLOCK,  # one prompt, n = 1
            "0_chatcmpl-55aa-0c1d2e3f": BLOCK,  # n = 2: two samples, one client id
            "1_chatcmpl-55aa-0c1d2e3f": 0,
            "cmpl-7f3e9-0-12345678": 0,  # another client's id that starts alike
        }
        now = time.time()
        for i, (rid, hit) in enumerate(told.items()):
            engine.follower.request(Arrive(rid, now + i, n, hashes))
            engine.follower.request(Scheduled(rid, now + i, hit))
        engine.follower.request(Finished("1_chatcmpl-55aa-0c1d2e3f", now + 9, n + 5))
        engine.follower.flush()
        await until(lambda: all(r in client.book.requests for r in told))
        before = pool_digest(mine.pool)

        s = await api.ok("GET", "/api/requests/cmpl-7f3e/story")
        assert s["request_id"] == "cmpl-7f3e-0-a7acb6a5" and s["client_id"] == "cmpl-7f3e"
        assert s["engine_ids"] == ["cmpl-7f3e-0-a7acb6a5"]
        assert s["hit_tokens"] == 2 * BLOCK and s["num_hit_blocks"] == 2
        assert s["num_prompt_tokens"] == n
        # the prompt index belongs to the client's id too (a batch of prompts)
        s = await api.ok("GET", "/api/requests/cmpl-7f3e-0/story")
        assert s["request_id"] == "cmpl-7f3e-0-a7acb6a5"
        # n = 2: the first sample's story, both named (the order the engine told them)
        s = await api.ok("GET", "/api/requests/chatcmpl-55aa/story")
        assert s["engine_ids"] == ["0_chatcmpl-55aa-0c1d2e3f", "1_chatcmpl-55aa-0c1d2e3f"]
        assert s["request_id"] == "0_chatcmpl-55aa-0c1d2e3f" and s["hit_tokens"] == BLOCK
        s = await api.ok("GET", "/api/requests/1_chatcmpl-55aa-0c1d2e3f/story")
        assert s["state"] == "finished" and s["num_tokens"] == n + 5
        assert s["client_id"] is None and s["engine_ids"] == ["1_chatcmpl-55aa-0c1d2e3f"]
        # vLLM's own id: itself; the look-alike is its own client's
        s = await api.ok("GET", "/api/requests/cmpl-7f3e9/story")
        assert s["request_id"] == "cmpl-7f3e9-0-12345678"
        for wrong in ("cmpl-7f3", "cmpl-7f3e-0-a7acb6a", "7f3e", "chatcmpl-55aa-0"):
            r = await api.get(f"/api/requests/{wrong}/story")
            assert_error(r, 404, "not_found")
            assert "by vLLM's id or the client's" in r.json()["error"]["message"]
        assert pool_digest(mine.pool) == before
        await anyio.sleep(0)
    mine.check()
    engine.rt.check()
