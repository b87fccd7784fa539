"""The request API: admit (prefix hits), append (allocate + cache as blocks
fill), finish (free in reverse), list and detail, and every refusal."""

from __future__ import annotations

import pytest

from blockpool import hash_block_tokens
from tests.app.conftest import Api, assert_error

pytestmark = pytest.mark.anyio


@pytest.mark.app_settings(num_blocks=11)
async def test_worked_example_from_the_spec(api: Api) -> None:
    """docs/spec.md §5: block_size 4, 11 blocks."""
    a = await api.admit(list(range(10)), request_id="A")
    assert a == {
        "request_id": "A",
        "block_ids": [[1, 2, 3]],
        "num_tokens": 10,
        "num_hit_blocks": 0,
        "num_computed_tokens": 0,
        "num_new_blocks": 3,
    }
    b = await api.admit([*range(8), 90, 91], request_id="B")
    assert b["block_ids"] == [[1, 2, 4]]
    assert b["num_hit_blocks"] == 2 and b["num_computed_tokens"] == 8
    assert b["num_new_blocks"] == 1
    assert (await api.ok("GET", "/api/blocks/2"))["ref_cnt"] == 2
    fa = await api.finish("A")
    assert fa == {"request_id": "A", "freed_block_ids": [[3, 2, 1]]}
    assert await api.queue() == [5, 6, 7, 8, 9, 10, 3]
    await api.finish("B")
    assert await api.queue() == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]
    s = await api.summary()
    assert s["prefix_cache"] == {
        "requests": 2,
        "queries_tokens": 20,
        "hits_tokens": 8,
        "hit_rate": 0.4,
    }
    assert s["counters"]["requests_admitted"] == 2
    assert s["counters"]["requests_finished"] == 2
    assert s["counters"]["blocks_allocated"] == 4
    assert s["counters"]["blocks_touched"] == 2
    assert s["counters"]["blocks_freed"] == 6
    assert s["running_requests"] == 0
    assert s["blocks"] == {"null": 1, "in_use": 0, "cached": 2, "empty": 8}
    api.check()


async def test_admit_caches_full_blocks_with_request_hashes(api: Api) -> None:
    tokens = list(range(1000, 1014))  # 3 full blocks + 2 tokens
    a = await api.admit(tokens, request_id="r1")
    fn = api.engine.hash_fn
    parent = None
    expected = []
    for i in range(3):
        parent = hash_block_tokens(fn, parent, tokens[4 * i : 4 * i + 4])
        expected.append(parent.hex())
    detail = await api.ok("GET", "/api/requests/r1")
    assert detail["block_ids"] == a["block_ids"] == [[1, 2, 3, 4]]
    assert detail["num_tokens"] == detail["num_prompt_tokens"] == 14
    assert detail["num_cached_blocks"] == 3 and detail["num_hit_blocks"] == 0
    assert [blk["block_hash"] for blk in detail["blocks"]] == [*expected, None]
    assert [blk["tokens"] for blk in detail["blocks"]] == [4, 4, 4, 2]
    assert [blk["block_ids"] for blk in detail["blocks"]] == [[1], [2], [3], [4]]
    [ev] = await api.events()
    assert ev["type"] == "BlockStored" and ev["token_ids"] == tokens[:12]
    assert ev["block_hashes"] == [h[-16:] for h in expected]
    assert ev["parent_block_hash"] is None and ev["block_size"] == 4
    # a second request with the same prompt reuses 3 blocks
    b = await api.admit(tokens, request_id="r2")
    assert b["block_ids"] == [[1, 2, 3, 5]] and b["num_hit_blocks"] == 3
    detail = await api.ok("GET", "/api/requests/r2")
    assert [blk["hit"] for blk in detail["blocks"]] == [True, True, True, False]
    api.check()


async def test_admit_with_salt_and_lora_only_hits_its_own_kind(api: Api) -> None:
    tokens = list(range(9))
    await api.admit(tokens, cache_salt="s1")
    other = await api.admit(tokens, cache_salt="s2")
    assert other["num_hit_blocks"] == 0
    same = await api.admit(tokens, cache_salt="s1")
    assert same["num_hit_blocks"] == 2
    lora = await api.admit(tokens, lora_name="adapter")
    assert lora["num_hit_blocks"] == 0
    detail = await api.ok("GET", f"/api/requests/{lora['request_id']}")
    assert detail["lora_name"] == "adapter" and detail["cache_salt"] is None
    api.check()


async def test_admit_assigns_request_ids(api: Api) -> None:
    a = await api.admit([1, 2, 3])
    b = await api.admit([4, 5, 6])
    assert a["request_id"] != b["request_id"]
    assert a["request_id"].startswith("req-")
    listing = await api.ok("GET", "/api/requests")
    assert listing["total"] == 2
    assert [i["request_id"] for i in listing["items"]] == [a["request_id"], b["request_id"]]
    assert listing["items"][0] == {
        "request_id": a["request_id"],
        "num_tokens": 3,
        "num_blocks": 1,
        "num_hit_blocks": 0,
    }
    page = await api.ok("GET", "/api/requests", params={"offset": 1, "limit": 1})
    assert [i["request_id"] for i in page["items"]] == [b["request_id"]]
    page = await api.ok("GET", "/api/requests", params={"offset": 10_000_000})
    assert page["items"] == [] and page["total"] == 2
    r = await api.get("/api/requests", params={"offset": 2**63})  # was a 500
    assert_error(r, 422, "invalid_input", contains="offset")
    api.check()


@pytest.mark.app_settings(num_blocks=11)
async def test_admit_not_enough_blocks_changes_nothing(api: Api) -> None:
    await api.admit(list(range(10)), request_id="A")  # 3 blocks, 7 free
    before = api.fingerprint()
    r = await api.post("/api/requests", {"token_ids": list(range(100, 133)), "request_id": "big"})
    err = assert_error(r, 409, "not_enough_blocks")
    assert err["details"]["requested"] == 9 and err["details"]["free"] == 7
    assert err["details"]["request_id"] == "big"
    assert api.fingerprint() == before
    s = await api.summary()
    assert s["counters"]["requests_refused"] == 1
    assert s["prefix_cache"]["requests"] == 1
    assert_error(await api.get("/api/requests/big"), 404)
    # a prefix hit whose cached blocks are free still needs them out of the queue
    await api.finish("A")
    before = api.fingerprint()
    r = await api.post("/api/requests", {"token_ids": [*range(8), *range(200, 236)]})
    err = assert_error(r, 409, "not_enough_blocks")  # 2 hits (free) + 9 new > 10 free
    assert err["details"]["requested"] == 11 and err["details"]["free"] == 10
    assert api.fingerprint() == before
    fits = await api.admit([*range(8), *range(200, 232)])
    assert fits["num_hit_blocks"] == 2 and fits["block_ids"][0][:2] == [1, 2]
    api.check()


async def test_duplicate_and_bad_request_ids(api: Api) -> None:
    await api.admit([1, 2, 3], request_id="dup")
    before = api.fingerprint()
    r = await api.post("/api/requests", {"token_ids": [1, 2, 3], "request_id": "dup"})
    assert_error(r, 409, "conflict", contains="already running")
    for bad in ["", "has space", "x" * 201, "é"]:
        r = await api.post("/api/requests", {"token_ids": [1], "request_id": bad})
        assert_error(r, 422, "invalid_input")
    for body in [{"token_ids": []}, {"token_ids": [-1]}, {}, {"token_ids": [1], "x": 1}]:
        assert_error(await api.post("/api/requests", body), 422, "invalid_input")
    assert api.fingerprint() == before
    api.check()


@pytest.mark.app_settings(max_requests=2)
async def test_max_requests(api: Api) -> None:
    await api.admit([1])
    await api.admit([2])
    before = api.fingerprint()
    err = assert_error(await api.post("/api/requests", {"token_ids": [3]}), 409, "conflict")
    assert err["details"] == {"limit": 2}
    assert api.fingerprint() == before
    api.check()


async def test_append_allocates_and_caches_as_blocks_fill(api: Api) -> None:
    a = await api.admit([1, 2, 3, 4, 5, 6], request_id="d")
    assert a["block_ids"] == [[1, 2]]
    before_events = api.engine.events.last_seq
    body = await api.ok("POST", "/api/requests/d/tokens", {"token_ids": [7, 8]})
    assert body == {"request_id": "d", "new_block_ids": [[]], "num_tokens": 8}
    [ev] = await api.events(since=before_events)  # block 2 is full now: cached
    hashes = api.engine.manager.block_hashes_of("d")
    assert len(hashes) == 2
    assert ev["type"] == "BlockStored"
    assert ev["block_hashes"] == [hashes[1][-8:].hex()]
    assert ev["parent_block_hash"] == hashes[0][-8:].hex()
    assert ev["token_ids"] == [5, 6, 7, 8]
    body = await api.ok("POST", "/api/requests/d/tokens", {"token_ids": [9]})
    assert body["new_block_ids"] == [[3]] and body["num_tokens"] == 9
    body = await api.ok("POST", "/api/requests/d/tokens", {"token_ids": list(range(10, 19))})
    assert body["new_block_ids"] == [[4, 5]] and body["num_tokens"] == 18
    detail = await api.ok("GET", "/api/requests/d")
    assert detail["num_cached_blocks"] == 4
    assert detail["num_prompt_tokens"] == 6 and detail["num_tokens"] == 18
    assert detail["block_ids"] == [[1, 2, 3, 4, 5]]
    # the decoded blocks hit for a prompt that continues the same text
    look = await api.ok("POST", "/api/pool/prefix-lookup", {"token_ids": list(range(1, 19))})
    assert look["num_hit_tokens"] == 16
    fin = await api.finish("d")
    assert fin["freed_block_ids"] == [[5, 4, 3, 2, 1]]
    assert (await api.queue())[-5:] == [5, 4, 3, 2, 1]
    api.check()


@pytest.mark.app_settings(num_blocks=6)
async def test_append_not_enough_blocks_changes_nothing(api: Api) -> None:
    await api.admit(list(range(16)), request_id="long")  # 4 of 5 blocks
    before = api.fingerprint()
    r = await api.post("/api/requests/long/tokens", {"token_ids": list(range(9))})
    err = assert_error(r, 409, "not_enough_blocks")
    assert err["details"] == {"requested": 3, "free": 1, "request_id": "long"}
    assert api.fingerprint() == before
    body = await api.ok("POST", "/api/requests/long/tokens", {"token_ids": [1, 2, 3, 4]})
    assert body["new_block_ids"] == [[5]]
    api.check()


@pytest.mark.app_settings(max_tokens_per_request=12)
async def test_token_limits(api: Api) -> None:
    await api.admit(list(range(10)), request_id="t")
    before = api.fingerprint()
    err = assert_error(await api.post("/api/requests", {"token_ids": list(range(13))}), 413)
    assert err["details"] == {"given": 13, "limit": 12}
    r = await api.post("/api/requests/t/tokens", {"token_ids": [1, 2, 3]})
    err = assert_error(r, 413, "too_large")
    assert err["details"] == {"given": 13, "limit": 12}
    r = await api.post("/api/pool/prefix-lookup", {"token_ids": list(range(13))})
    assert_error(r, 413, "too_large")
    assert api.fingerprint() == before
    api.check()


async def test_finish_twice_unknown_and_after_finish(api: Api) -> None:
    await api.admit(list(range(5)), request_id="once")
    await api.finish("once")
    before = api.fingerprint()
    err = assert_error(await api.post("/api/requests/once/finish"), 409, "conflict")
    assert "already finished" in err["message"] and err["details"] == {"request_id": "once"}
    r = await api.post("/api/requests/once/tokens", {"token_ids": [1]})
    assert_error(r, 409, "conflict", contains="already finished")
    err = assert_error(await api.post("/api/requests/ghost/finish"), 404, "not_found")
    assert err["details"] == {"request_id": "ghost"}
    assert_error(await api.post("/api/requests/ghost/tokens", {"token_ids": [1]}), 404)
    assert_error(await api.get("/api/requests/once"), 404, "not_found")
    assert_error(await api.post("/api/requests/once/tokens", {"token_ids": []}), 422)
    assert_error(await api.post("/api/requests/once/tokens", {"tokens": [1]}), 422)
    assert api.fingerprint() == before
    # the id can be used again once finished
    again = await api.admit(list(range(5)), request_id="once")
    assert again["num_hit_blocks"] == 1
    api.check()


async def test_many_requests_share_a_prefix_and_free_in_reverse(api: Api) -> None:
    system = list(range(500, 516))  # 4 shared blocks
    ids = []
    for i in range(5):
        adm = await api.admit([*system, 1000 + i, 2000 + i], request_id=f"u{i}")
        ids.append(adm["block_ids"][0])
        assert adm["num_hit_blocks"] == (0 if i == 0 else 4)
    assert all(row[:4] == [1, 2, 3, 4] for row in ids)
    assert (await api.ok("GET", "/api/blocks/1"))["ref_cnt"] == 5
    blk = await api.ok("GET", "/api/blocks/4")
    assert blk["requests"] == [f"u{i}" for i in range(5)]
    for i in range(5):
        await api.finish(f"u{i}")
    q = await api.queue()
    # the private tails went first, in finishing order; the shared chain last,
    # tail to root: block 1 is evicted last
    assert q[-9:] == [5, 6, 7, 8, 9, 4, 3, 2, 1]
    s = await api.summary()
    assert s["prefix_cache"]["hits_tokens"] == 4 * 16
    assert s["prefix_cache"]["queries_tokens"] == 5 * 18
    api.check()


@pytest.mark.app_settings(num_blocks=40)
async def test_seeded_random_walk_keeps_every_invariant(api: Api) -> None:
    """1,500 state-aware operations of every kind (some bound to be refused):
    never a 5xx, refusals change nothing, engine.check() after each step, and
    the block API's own reference model agrees with the pool."""
    import random

    rng = random.Random(1234)
    held: list[int] = []  # block references taken through the block API
    running: list[str] = []
    finished: list[str] = []
    prefixes = [list(range(100 * i, 100 * i + 8)) for i in range(3)]
    statuses: dict[int, int] = {}
    for step in range(1500):
        kind = rng.choice(
            ["allocate", "free", "touch", "cache", "evict", "admit", "append", "finish", "reset",
             "lookup", "refinish"]
        )  # fmt: skip
        before = api.fingerprint()
        if kind == "allocate":
            r = await api.post("/api/pool/allocate", {"num_blocks": rng.randint(0, 6)})
            if r.status_code == 200:
                held += r.json()["block_ids"]
        elif kind == "free":
            ids = rng.sample(held, k=min(len(held), rng.randint(0, 4)))
            if rng.random() < 0.1:
                ids.append(rng.randrange(1, 40))  # maybe not held: refused as a whole
            r = await api.post("/api/pool/free", {"block_ids": ids})
            if r.status_code == 200:
                for b in ids:
                    held.remove(b)
        elif kind == "touch":
            ids = [rng.randrange(1, 40) for _ in range(rng.randint(1, 3))]
            r = await api.post("/api/pool/touch", {"block_ids": ids})
            if r.status_code == 200:
                held += ids
        elif kind == "cache":
            ids = list(dict.fromkeys(rng.sample(held, k=min(len(held), 2))))
            if not ids:
                continue
            body = {"block_ids": ids, "token_ids": [rng.randrange(50) for _ in range(4 * len(ids))]}
            r = await api.post("/api/pool/cache", body)
        elif kind == "evict":
            r = await api.post("/api/pool/evict", {"block_ids": [rng.randrange(0, 40)]})
        elif kind == "admit":
            tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 9))]
            r = await api.post("/api/requests", {"token_ids": tokens})
            if r.status_code == 201:
                running.append(r.json()["request_id"])
        elif kind == "append" and running:
            rid = rng.choice(running)
            n = rng.randint(1, 6)
            r = await api.post(f"/api/requests/{rid}/tokens", {"token_ids": [7] * n})
        elif kind == "finish" and running:
            rid = running.pop(rng.randrange(len(running)))
            r = await api.post(f"/api/requests/{rid}/finish")
            assert r.status_code == 200, r.text
            finished.append(rid)
        elif kind == "refinish" and finished:
            r = await api.post(f"/api/requests/{rng.choice(finished)}/finish")
            assert r.status_code == 409, r.text
        elif kind == "reset":
            r = await api.post("/api/pool/reset")
            assert r.status_code == (409 if held or running else 200), r.text
        elif kind == "lookup":
            r = await api.post("/api/pool/prefix-lookup", {"token_ids": rng.choice(prefixes)})
            assert api.fingerprint() == before
        else:
            continue
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, r.text
        if r.status_code >= 400:
            assert_error(r, r.status_code)
            assert api.fingerprint() == before, (step, kind, r.text)
        api.check()
        raw = api.engine.raw_refs.tolist()
        assert raw == [held.count(b) for b in range(40)], step
    assert statuses.get(409, 0) > 50 and statuses.get(200, 0) > 500, statuses
    for rid in running:
        await api.finish(rid)
    await api.free(held)
    assert await api.ok("POST", "/api/pool/reset") == {"reset": True}
    s = await api.summary()
    assert s["blocks"] == {"null": 1, "in_use": 0, "cached": 0, "empty": 39}
    api.check()
