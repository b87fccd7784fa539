"""The pool endpoints: config, summary, allocate, free, touch, evict, reset —
ids, queue order, ref counts, map and events (cache and the lookups:
test_cache_api.py)."""

from __future__ import annotations

import pytest

from tests.app.conftest import Api, assert_error
from tests.app.hashes import h64

pytestmark = pytest.mark.anyio

ALL = list(range(1, 64))  # the free queue of a fresh 64-block pool


# ------------------------------------------------------------ config, summary


async def test_config_reports_settings(api: Api) -> None:
    cfg = await api.ok("GET", "/api/config")
    assert cfg["num_blocks"] == 64
    assert cfg["block_size"] == cfg["hash_block_size"] == 4
    assert cfg["num_groups"] == 1
    assert cfg["hash_fn"] == "sha256"
    assert cfg["enable_caching"] is True and cfg["enable_events"] is True
    assert cfg["strict"] is True
    assert cfg["auth_required_for_writes"] is False
    assert cfg["auth_required_for_reads"] is False
    limits = cfg["limits"]
    s = api.engine.settings
    assert limits == {
        "max_body_bytes": s.max_body_bytes,
        "max_ids_per_call": s.max_ids_per_call,
        "max_tokens_per_request": s.max_tokens_per_request,
        "max_batch_ops": s.max_batch_ops,
        "max_requests": s.max_requests,
    }
    # K/V storage is on by default: its facts follow the pool's shape
    storage = cfg["storage"]
    assert storage["num_blocks"] == 64 and storage["block_size"] == 4
    assert storage["bytes_allocated"] == 64 * storage["bytes_per_block"]


@pytest.mark.app_settings(storage=False)
async def test_config_without_storage(api: Api) -> None:
    cfg = await api.ok("GET", "/api/config")
    assert cfg["storage"] is None
    assert await api.allocate(2) == [1, 2]
    api.check()


async def test_health(api: Api) -> None:
    assert await api.ok("GET", "/api/health") == {"status": "ok", "num_blocks": 64}


def pool_counts(api: Api) -> dict[str, int]:
    pool = api.engine.pool
    in_use = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
    free = list(pool.free_block_queue)
    cached = sum(1 for b in free if b.block_hash is not None)
    return {"null": 1, "in_use": in_use, "cached": cached, "empty": len(free) - cached}


async def test_summary_agrees_with_pool(api: Api) -> None:
    s = await api.summary()
    assert s["blocks"] == {"null": 1, "in_use": 0, "cached": 0, "empty": 63}
    assert s["num_free_blocks"] == 63 and s["usage"] == 0.0

    ids = await api.allocate(6)
    await api.cache(ids[:3], list(range(12)))
    await api.free([ids[2], ids[1], ids[5]])  # two cached + one empty go free
    s = await api.summary()
    assert s["blocks"] == pool_counts(api) == {"null": 1, "in_use": 3, "cached": 2, "empty": 58}
    assert s["num_free_blocks"] == 60 == api.engine.pool.get_num_free_blocks()
    assert s["usage"] == pytest.approx(3 / 63)
    assert s["hash_map_keys"] == 3
    c = s["counters"]
    assert c["blocks_allocated"] == 6
    assert c["blocks_freed"] == 3
    assert c["blocks_cached"] == 3
    assert c["events"] == {"BlockStored": 1, "BlockRemoved": 0, "AllBlocksCleared": 0}
    assert s["event_log"]["last_seq"] == 1
    assert s["running_requests"] == 0
    api.check()


# ------------------------------------------------------------ allocate / free


async def test_allocate_takes_the_queue_head_in_order(api: Api) -> None:
    assert await api.allocate(3) == [1, 2, 3]
    assert await api.queue() == list(range(4, 64))
    assert await api.allocate(0) == []
    await api.free([2])
    assert await api.queue() == [*range(4, 64), 2]
    assert await api.allocate(60) == list(range(4, 64))
    assert await api.allocate(1) == [2]
    assert await api.queue() == []
    block = await api.ok("GET", "/api/blocks/2")
    assert block["ref_cnt"] == 1 and block["raw_refs"] == 1 and block["state"] == "in_use"
    api.check()


async def test_allocate_reports_evicted_cached_blocks(api: Api) -> None:
    ids = await api.allocate(3)
    hashes = await api.cache(ids[:2], list(range(8)))
    await api.free([ids[1], ids[0], ids[2]])
    assert await api.queue() == [*range(4, 64), 2, 1, 3]
    last = api.engine.events.last_seq
    body = await api.ok("POST", "/api/pool/allocate", {"num_blocks": 62})
    assert body["block_ids"] == [*range(4, 64), 2, 1]
    assert body["evicted"] == [2, 1]
    removed = await api.events(since=last)
    assert [(e["type"], e["block_hashes"], e["medium"]) for e in removed] == [
        ("BlockRemoved", [h64(hashes[1])], "GPU"),
        ("BlockRemoved", [h64(hashes[0])], "GPU"),
    ]
    assert [e["seq"] for e in removed] == [last + 1, last + 2]
    assert api.engine.pool.cached_block_hash_to_block._cache == {}
    api.check()


async def test_allocate_not_enough_blocks_changes_nothing(api: Api) -> None:
    await api.allocate(60)
    before = api.fingerprint()
    err = assert_error(
        await api.post("/api/pool/allocate", {"num_blocks": 4}), 409, "not_enough_blocks"
    )
    assert err["details"] == {"requested": 4, "free": 3}
    assert "4" in err["message"] and "3" in err["message"]
    assert api.fingerprint() == before
    api.check()


async def test_free_appends_in_the_given_order(api: Api) -> None:
    ids = await api.allocate(5)
    assert ids == [1, 2, 3, 4, 5]
    body = await api.free([5, 3, 1])
    assert body == {"freed": [5, 3, 1], "now_free": [5, 3, 1]}
    assert await api.queue() == [*range(6, 64), 5, 3, 1]
    await api.free([4, 2])
    assert await api.queue() == [*range(6, 64), 5, 3, 1, 4, 2]
    assert api.pool_queue() == await api.queue()
    api.check()


async def test_free_of_a_shared_block_only_drops_a_reference(api: Api) -> None:
    ids = await api.allocate(2)
    await api.ok("POST", "/api/pool/touch", {"block_ids": [ids[0]]})
    body = await api.free([ids[1], ids[0]])
    assert body["now_free"] == [ids[1]]
    assert (await api.ok("GET", f"/api/blocks/{ids[0]}"))["ref_cnt"] == 1
    assert (await api.queue())[-1] == ids[1]
    await api.free([ids[0]])
    assert (await api.queue())[-2:] == [ids[1], ids[0]]
    api.check()


@pytest.mark.parametrize(
    ("ids", "code", "fragment"),
    [
        ([5], "conflict", "already free"),
        ([0], "conflict", "null block"),
        ([1, 1], "conflict", "held 1 time(s) but would be freed 2"),
        ([1, 64], "invalid_input", "outside the pool"),
    ],
)
async def test_free_refused_changes_nothing(
    api: Api, ids: list[int], code: str, fragment: str
) -> None:
    await api.allocate(2)
    before = api.fingerprint()
    r = await api.post("/api/pool/free", {"block_ids": ids})
    assert_error(r, 409 if code == "conflict" else 422, code, contains=fragment)
    assert api.fingerprint() == before
    api.check()


async def test_free_of_a_request_block_is_refused(api: Api) -> None:
    adm = await api.admit(list(range(8)))
    before = api.fingerprint()
    bid = adm["block_ids"][0][0]
    err = assert_error(await api.post("/api/pool/free", {"block_ids": [bid]}), 409, "conflict")
    assert "finish the request" in err["message"]
    assert api.fingerprint() == before
    api.check()


# ------------------------------------------------------------ touch


async def test_touch_takes_free_blocks_out_of_the_queue(api: Api) -> None:
    ids = await api.allocate(3)
    await api.cache(ids[:2], list(range(8)))
    await api.free(ids[::-1])
    assert await api.queue() == [*range(4, 64), 3, 2, 1]
    body = await api.ok("POST", "/api/pool/touch", {"block_ids": [1, 2]})
    assert body == {"block_ids": [1, 2], "ref_cnts": [1, 1]}
    assert await api.queue() == [*range(4, 64), 3]
    # touching an in-use block: another reference, queue untouched
    body = await api.ok("POST", "/api/pool/touch", {"block_ids": [1, 1]})
    assert body["ref_cnts"] == [3, 3]
    assert await api.queue() == [*range(4, 64), 3]
    blk = await api.ok("GET", "/api/blocks/1")
    assert blk["ref_cnt"] == 3 and blk["raw_refs"] == 3 and blk["block_hash"] is not None
    s = await api.summary()
    assert s["counters"]["blocks_touched"] == 4
    assert s["blocks"] == pool_counts(api)
    assert [e["type"] for e in await api.events()] == ["BlockStored"]  # touch emits nothing
    api.check()


async def test_touch_null_block_is_refused(api: Api) -> None:
    before = api.fingerprint()
    assert_error(await api.post("/api/pool/touch", {"block_ids": [3, 0]}), 409, "conflict")
    assert api.fingerprint() == before
    api.check()


# ------------------------------------------------------------ evict / reset


async def test_evict_drops_hashes_only(api: Api) -> None:
    ids = await api.allocate(4)
    hashes = await api.cache(ids[:3], list(range(12)))
    await api.free([ids[2]])  # cached + free
    q = await api.queue()
    last = api.engine.events.last_seq
    body = await api.ok("POST", "/api/pool/evict", {"block_ids": [ids[0], ids[2], ids[3], ids[0]]})
    assert body == {"evicted": [ids[0], ids[2]], "not_cached": [ids[3]]}
    assert await api.queue() == q  # a free block stays where it is
    b0 = await api.ok("GET", f"/api/blocks/{ids[0]}")
    assert b0["state"] == "in_use" and b0["ref_cnt"] == 1 and b0["block_hash"] is None
    b2 = await api.ok("GET", f"/api/blocks/{ids[2]}")
    assert b2["state"] == "empty" and b2["queue_position"] == q.index(ids[2])
    evs = await api.events(since=last)
    assert [(e["type"], e["block_hashes"]) for e in evs] == [
        ("BlockRemoved", [h64(hashes[0])]),
        ("BlockRemoved", [h64(hashes[2])]),
    ]
    s = await api.summary()
    assert s["counters"]["evictions"] == 2 and s["hash_map_keys"] == 1
    assert s["blocks"] == pool_counts(api)
    api.check()


async def test_evict_out_of_range_changes_nothing(api: Api) -> None:
    ids = await api.allocate(1)
    await api.cache(ids, [1, 2, 3, 4])
    before = api.fingerprint()
    err = assert_error(await api.post("/api/pool/evict", {"block_ids": [1, 64]}), 422)
    assert err["details"]["invalid_ids"] == [64] and err["details"]["num_blocks"] == 64
    assert api.fingerprint() == before
    api.check()


async def test_reset_refused_while_blocks_are_held(api: Api) -> None:
    ids = await api.allocate(3)
    await api.cache(ids[:2], list(range(8)))
    await api.admit(list(range(20, 30)))
    before = api.fingerprint()
    r = await api.post("/api/pool/reset")
    err = assert_error(r, 409, "reset_refused")
    assert err["details"] == {"held_blocks": 6, "running_requests": 1}
    assert "6 block(s)" in err["message"]
    assert api.fingerprint() == before
    s = await api.summary()
    assert s["counters"]["resets"] == 0 and s["counters"]["resets_refused"] == 1
    assert s["hash_map_keys"] == 4
    api.check()


async def test_reset_clears_the_cache_when_nothing_is_held(api: Api) -> None:
    ids = await api.allocate(3)
    await api.cache(ids, list(range(12)))
    await api.free(ids[::-1])
    q = await api.queue()
    last = api.engine.events.last_seq
    assert await api.ok("POST", "/api/pool/reset") == {"reset": True}
    assert await api.queue() == q  # order untouched
    evs = await api.events(since=last)
    assert [e["type"] for e in evs] == ["AllBlocksCleared"]
    assert evs[0]["seq"] == last + 1
    s = await api.summary()
    assert s["hash_map_keys"] == 0
    assert s["blocks"] == {"null": 1, "in_use": 0, "cached": 0, "empty": 63}
    assert s["counters"]["resets"] == 1
    assert all(b.block_hash is None for b in api.engine.pool.blocks)
    # the cache really is empty: the same prompt no longer hits
    body = await api.ok("POST", "/api/pool/prefix-lookup", {"token_ids": list(range(13))})
    assert body["num_hit_tokens"] == 0
    api.check()
