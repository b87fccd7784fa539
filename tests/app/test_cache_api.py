"""The pool's cache and lookup endpoints: cache_full_blocks from token ids or
precomputed hashes (LoRA, salt, parent, group), lookups across groups and
prefix lookups — hashes, events and the map; refusals change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conftest import Api, assert_error
from tests.app.hashes import chain, h64

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------ cache


async def test_cache_token_ids_chain_hashes_and_event(api: Api) -> None:
    ids = await api.allocate(3)
    tokens = list(range(100, 112))
    hashes = await api.cache(ids, tokens)
    assert hashes == chain(api, tokens)
    pool = api.engine.pool
    for bid, hx in zip(ids, hashes, strict=True):
        blk = await api.ok("GET", f"/api/blocks/{bid}")
        assert blk["block_hash"] == hx
        assert blk["hash64"] == h64(hx)
        assert blk["group_id"] == 0
        assert blk["copies_under_hash"] == 1
        assert pool.blocks[bid].block_hash == bytes.fromhex(hx) + b"\0\0\0\0"
    [ev] = await api.events()
    assert ev == {
        "seq": 1,
        "ts": ev["ts"],
        "type": "BlockStored",
        "block_hashes": [h64(x) for x in hashes],
        "parent_block_hash": None,
        "token_ids": tokens,
        "block_size": 4,
        "lora_id": None,
        "lora_name": None,
        "medium": "GPU",
    }
    api.check()


async def test_cache_with_lora_salt_and_parent(api: Api) -> None:
    ids = await api.allocate(3)
    tokens = list(range(8))
    hashes = await api.cache(ids[:2], tokens, lora_name="ad1", cache_salt="salt")
    expected = chain(api, tokens, extra=lambda i: ("ad1", "salt") if i == 0 else ("ad1",))
    assert hashes == expected
    # continue the chain from block 2's hash: parent_block_hash
    more = await api.cache([ids[2]], [8, 9, 10, 11], parent_block_hash=hashes[1], lora_name="ad1")
    assert more == chain(api, [8, 9, 10, 11], parent=bytes.fromhex(hashes[1]), extra=("ad1",))
    ev1, ev2 = await api.events()
    assert ev1["lora_name"] == "ad1" and ev1["lora_id"] == 1 and ev1["parent_block_hash"] is None
    assert ev2["parent_block_hash"] == h64(hashes[1])
    assert ev2["block_hashes"] == [h64(more[0])] and ev2["token_ids"] == [8, 9, 10, 11]
    # a request with the same lora and salt finds the whole raw-cached chain
    body = await api.ok(
        "POST",
        "/api/pool/prefix-lookup",
        {"token_ids": [*range(12), 99], "lora_name": "ad1", "cache_salt": "salt"},
    )
    assert body["num_hit_tokens"] == 12 and body["num_hit_blocks"] == 3
    body = await api.ok("POST", "/api/pool/prefix-lookup", {"token_ids": [*range(12), 99]})
    assert body["num_hit_tokens"] == 0
    api.check()


async def test_cache_precomputed_hashes_and_group(api: Api) -> None:
    ids = await api.allocate(2)
    hx = ["ab" * 32, "cd" * 16]
    body = await api.ok(
        "POST",
        "/api/pool/cache",
        {"block_ids": ids, "block_hashes": hx, "group_id": 3, "parent_block_hash": "ee" * 8},
    )
    assert body == {"block_ids": ids, "block_hashes": hx}
    blk = await api.ok("GET", f"/api/blocks/{ids[1]}")
    assert blk["block_hash"] == hx[1] and blk["group_id"] == 3
    [ev] = await api.events()
    assert ev["block_hashes"] == [h64(hx[0]), h64(hx[1])]
    assert ev["parent_block_hash"] == "ee" * 8
    assert ev["token_ids"] == []
    hit = await api.ok("GET", "/api/pool/lookup", params={"block_hash": hx[0], "group_id": 3})
    assert hit == {"hit": True, "group_ids": [3], "block_ids": [ids[0]]}
    miss = await api.ok("GET", "/api/pool/lookup", params={"block_hash": hx[0]})
    assert miss == {"hit": False, "group_ids": [0], "block_ids": None}
    api.check()


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"block_ids": [1, 2], "token_ids": list(range(7))}, 422, "need 8 token ids, got 7"),
        ({"block_ids": [1, 1], "token_ids": list(range(8))}, 422, "distinct"),
        ({"block_ids": [1]}, 422, "exactly one of"),
        ({"block_ids": [1], "token_ids": [1, 2, 3, 4], "block_hashes": ["ab"]}, 422, "exactly one"),
        ({"block_ids": [1], "block_hashes": ["ab", "cd"]}, 422, "need 1 hashes, got 2"),
        ({"block_ids": [1], "block_hashes": ["ab"], "lora_name": "x"}, 422, "token_ids only"),
        ({"block_ids": [5], "token_ids": [1, 2, 3, 4]}, 409, "not held"),
        ({"block_ids": [0], "token_ids": [1, 2, 3, 4]}, 409, "null block"),
        ({"block_ids": [3], "token_ids": [1, 2, 3, 4]}, 409, "already cached"),
        ({"block_ids": [1, 99], "token_ids": list(range(8))}, 422, "outside the pool"),
        ({"block_ids": [1], "block_hashes": ["abc"]}, 422, "pattern"),
        ({"block_ids": [], "token_ids": []}, 422, "at least 1"),
    ],
)
async def test_cache_refused_changes_nothing(
    api: Api, body: dict[str, Any], status: int, fragment: str
) -> None:
    await api.allocate(3)
    await api.cache([3], [7, 7, 7, 7])
    before = api.fingerprint()
    err = assert_error(await api.post("/api/pool/cache", body), status)
    assert fragment in err["message"], err
    assert api.fingerprint() == before
    api.check()


async def test_cache_refuses_a_running_requests_block(api: Api) -> None:
    """A request's tail block, touched through the block API, must not be
    hashed from outside: the request caches it itself once it fills (this
    used to end in a 500 half-way through the request's append)."""
    adm = await api.admit([1, 2, 3, 4, 5, 6], request_id="r")
    tail = adm["block_ids"][0][1]
    await api.ok("POST", "/api/pool/touch", {"block_ids": [tail]})
    before = api.fingerprint()
    r = await api.post("/api/pool/cache", {"block_ids": [tail], "token_ids": [9, 9, 9, 9]})
    err = assert_error(r, 409, "conflict", contains="belongs to a running request")
    assert err["details"] == {"block_id": tail}
    assert api.fingerprint() == before
    body = await api.ok("POST", "/api/requests/r/tokens", {"token_ids": [7, 8]})
    assert body["new_block_ids"] == [[]]
    assert api.engine.pool.blocks[tail].block_hash is not None  # cached by the request
    await api.finish("r")
    await api.free([tail])
    api.check()


# ------------------------------------------------------------ lookups


@pytest.mark.app_settings(num_groups=2)
async def test_lookup_is_all_or_nothing_across_groups(api: Api) -> None:
    ids = await api.allocate(2)
    hx = "5a" * 32
    await api.ok("POST", "/api/pool/cache", {"block_ids": [ids[0]], "block_hashes": [hx]})
    one = await api.ok("GET", "/api/pool/lookup", params={"block_hash": hx, "group_id": [0]})
    assert one == {"hit": True, "group_ids": [0], "block_ids": [ids[0]]}
    both = await api.ok("GET", "/api/pool/lookup", params={"block_hash": hx, "group_id": [0, 1]})
    assert both == {"hit": False, "group_ids": [0, 1], "block_ids": None}
    await api.ok(
        "POST", "/api/pool/cache", {"block_ids": [ids[1]], "block_hashes": [hx], "group_id": 1}
    )
    both = await api.ok("GET", "/api/pool/lookup", params={"block_hash": hx, "group_id": [0, 1]})
    assert both == {"hit": True, "group_ids": [0, 1], "block_ids": [ids[0], ids[1]]}
    rev = await api.ok("GET", "/api/pool/lookup", params={"block_hash": hx, "group_id": [1, 0]})
    assert rev["block_ids"] == [ids[1], ids[0]]
    cfg = await api.ok("GET", "/api/config")
    assert cfg["num_groups"] == 2
    assert (await api.summary())["groups"] == [0, 1]
    api.check()


@pytest.mark.app_settings(num_groups=2)
async def test_requests_with_two_groups_hit_in_both(api: Api) -> None:
    a = await api.admit(list(range(10)))
    assert a["block_ids"] == [[1, 2, 3], [4, 5, 6]]
    assert a["num_new_blocks"] == 6
    b = await api.admit([*range(8), 50, 51])
    assert b["num_hit_blocks"] == 2
    assert b["block_ids"] == [[1, 2, 7], [4, 5, 8]]
    await api.finish(a["request_id"])
    await api.finish(b["request_id"])
    assert (await api.queue())[-8:] == [3, 6, 7, 2, 1, 8, 5, 4]
    api.check()


async def test_lookup_bad_hash_is_422(api: Api) -> None:
    r = await api.get("/api/pool/lookup", params={"block_hash": "xyz"})
    assert_error(r, 422, "invalid_input", contains="block_hash")
    r = await api.get("/api/pool/lookup")
    assert_error(r, 422, "invalid_input", contains="Field required")
    for bad in ["-1", "x", str(2**31)]:  # -1 used to reach the engine and 500
        r = await api.get("/api/pool/lookup", params={"block_hash": "ab", "group_id": bad})
        assert_error(r, 422, "invalid_input", contains="group_id")
    r = await api.get("/api/pool/lookup", params={"block_hash": "ab", "group_id": list(range(65))})
    assert_error(r, 422, "invalid_input")


async def test_prefix_lookup_changes_nothing(api: Api) -> None:
    await api.admit(list(range(10)))
    before = api.fingerprint()
    cases = [
        (list(range(10)), 8),
        (list(range(8)), 4),  # the block of the last token is never a hit
        ([*range(8), 77, 78, 79, 80, 81], 8),
        ([1, 2, 3, 4, 5], 0),
        ([0], 0),
    ]
    for tokens, hit in cases:
        body = await api.ok("POST", "/api/pool/prefix-lookup", {"token_ids": tokens})
        assert body == {
            "num_tokens": len(tokens),
            "num_hit_tokens": hit,
            "num_hit_blocks": hit // 4,
        }
    assert api.fingerprint() == before
    api.check()
