"""/api/batch with on_error stop / continue: many operations in one engine
step, each all-or-nothing (partial application, asked for explicitly);
limits checked on the whole batch first.  The default, all or nothing:
test_batch_atomic.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conftest import Api, assert_error

pytestmark = pytest.mark.anyio


async def test_batch_results_per_op(api: Api) -> None:
    ops: list[dict[str, Any]] = [
        {"op": "allocate", "num_blocks": 3},
        {"op": "cache", "block_ids": [1, 2], "token_ids": list(range(8))},
        {"op": "touch", "block_ids": [1]},
        {"op": "free", "block_ids": [3, 2, 1]},
        {"op": "admit", "request_id": "b1", "token_ids": list(range(10))},
        {"op": "append", "request_id": "b1", "token_ids": [10, 11]},
        {"op": "prefix_lookup", "token_ids": list(range(12))},
        {"op": "finish", "request_id": "b1"},
        {"op": "evict", "block_ids": [1]},
        {"op": "reset"},
    ]
    body = await api.ok("POST", "/api/batch", {"ops": ops, "on_error": "stop"})
    assert body["applied"] == 9 and body["failed"] == 1 and body["errors"] is True
    r = body["results"]
    assert r[0] == {"ok": True, "result": {"block_ids": [1, 2, 3], "evicted": []}}
    assert r[1]["ok"] and len(r[1]["result"]["block_hashes"]) == 2
    assert r[2] == {"ok": True, "result": {"block_ids": [1], "ref_cnts": [2]}}
    assert r[3] == {"ok": True, "result": {"freed": [3, 2, 1], "now_free": [3, 2]}}
    # the request hits blocks 1 (held) and 2 (free), then takes 2 more from the head
    assert r[4]["result"]["block_ids"] == [[1, 2, 4]]
    assert r[4]["result"]["num_hit_blocks"] == 2
    assert r[5]["result"] == {"request_id": "b1", "new_block_ids": [[]], "num_tokens": 12}
    assert r[6]["result"]["num_hit_tokens"] == 8  # block 3 (tokens 8..11) holds the last one
    assert r[7]["result"]["freed_block_ids"] == [[4, 2, 1]]
    assert r[8]["result"] == {"evicted": [1], "not_cached": []}
    # block 1 is still held once through the block API: the reset is refused
    assert r[9]["ok"] is False
    assert r[9]["error"]["code"] == "reset_refused" and r[9]["error"]["status"] == 409
    assert r[9]["error"]["details"]["held_blocks"] == 1
    assert (await api.ok("GET", "/api/blocks/1"))["ref_cnt"] == 1
    api.check()


async def test_batch_stop_skips_the_rest(api: Api) -> None:
    ops = [
        {"op": "allocate", "num_blocks": 2},
        {"op": "free", "block_ids": [5]},  # not held: refused
        {"op": "allocate", "num_blocks": 1},
        {"op": "reset"},
    ]
    body = await api.ok("POST", "/api/batch", {"ops": ops, "on_error": "stop"})
    assert body["applied"] == 1 and body["failed"] == 1 and body["errors"] is True
    r = body["results"]
    assert r[0]["ok"] is True
    assert r[1]["ok"] is False and r[1]["error"]["code"] == "conflict"
    assert set(r[1]["error"]) == {"status", "code", "message", "details"}
    assert r[2] == {"ok": False, "skipped": True}
    assert r[3] == {"ok": False, "skipped": True}
    assert await api.queue() == list(range(3, 64))
    s = await api.summary()
    assert s["counters"]["blocks_allocated"] == 2
    api.check()


async def test_batch_continue_runs_everything(api: Api) -> None:
    ops = [
        {"op": "allocate", "num_blocks": 2},
        {"op": "free", "block_ids": [5]},
        {"op": "allocate", "num_blocks": 100},
        {"op": "allocate", "num_blocks": 1},
    ]
    body = await api.ok("POST", "/api/batch", {"ops": ops, "on_error": "continue"})
    assert body["applied"] == 2 and body["failed"] == 2
    r = body["results"]
    assert r[2]["error"]["code"] == "not_enough_blocks"
    assert r[2]["error"]["details"] == {"requested": 100, "free": 61}
    assert r[3] == {"ok": True, "result": {"block_ids": [3], "evicted": []}}
    assert await api.queue() == list(range(4, 64))
    api.check()


async def test_batch_failed_op_is_all_or_nothing(api: Api) -> None:
    ops = [
        {"op": "allocate", "num_blocks": 2},
        # one bad id among good ones: nothing of this op happens
        {"op": "free", "block_ids": [1, 2, 2]},
        {"op": "cache", "block_ids": [1, 2], "token_ids": list(range(7))},
    ]
    body = await api.ok("POST", "/api/batch", {"ops": ops, "on_error": "continue"})
    assert [x["ok"] for x in body["results"]] == [True, False, False]
    assert [b.ref_cnt for b in api.engine.pool.blocks[1:3]] == [1, 1]
    assert api.engine.pool.cached_block_hash_to_block._cache == {}
    api.check()


@pytest.mark.app_settings(max_batch_ops=4, max_ids_per_call=3, max_tokens_per_request=8)
@pytest.mark.parametrize(
    ("ops", "status", "fragment"),
    [
        ([{"op": "allocate", "num_blocks": 1}] * 5, 413, "5 operations, the limit is 4"),
        (
            [{"op": "allocate", "num_blocks": 1}, {"op": "free", "block_ids": [1, 2, 3, 4]}],
            413,
            "ops[1]: free: 4 block ids",
        ),
        (
            [{"op": "allocate", "num_blocks": 1}, {"op": "allocate", "num_blocks": 4}],
            413,
            "ops[1]: allocate: 4 blocks",
        ),
        (
            [{"op": "allocate", "num_blocks": 1}, {"op": "admit", "token_ids": list(range(9))}],
            413,
            "ops[1]: admit: 9 tokens",
        ),
        (
            [{"op": "allocate", "num_blocks": 1}, {"op": "free", "block_ids": [1, 99]}],
            422,
            "ops[1]: free: block id 99",
        ),
        ([{"op": "allocate", "num_blocks": 1}, {"op": "nope"}], 422, "ops.1"),
        ([{"op": "allocate", "num_blocks": 1}, {"num_blocks": 1}], 422, "ops.1"),
        ([{"op": "allocate", "num_blocks": "1"}], 422, "num_blocks"),
        ([], 422, "ops"),
    ],
)
async def test_batch_over_limits_applies_nothing(
    api: Api, ops: list[dict[str, Any]], status: int, fragment: str
) -> None:
    before = api.fingerprint()
    ops_before = api.engine.counters.ops
    err = assert_error(await api.post("/api/batch", {"ops": ops}), status)
    assert fragment in err["message"], err["message"]
    assert api.fingerprint() == before
    assert api.engine.counters.ops == ops_before  # nothing reached the engine
    api.check()


async def test_batch_body_shape(api: Api) -> None:
    before = api.fingerprint()
    for body in [
        {"ops": [{"op": "reset"}], "on_error": "maybe"},
        {"ops": [{"op": "reset"}], "extra": 1},
        {"ops": {"op": "reset"}},
        [{"op": "reset"}],
    ]:
        assert_error(await api.post("/api/batch", body), 422, "invalid_input")
    assert api.fingerprint() == before


async def test_large_batch_of_block_ops(api: Api) -> None:
    ops: list[dict[str, Any]] = []
    for _ in range(50):
        ops.append({"op": "allocate", "num_blocks": 63})
        ops.append({"op": "free", "block_ids": list(range(63, 0, -1))})
    body = await api.ok("POST", "/api/batch", {"ops": ops})
    assert body["applied"] == 100 and body["failed"] == 0
    # each round takes the queue from its head; the reversed frees flip it
    assert body["results"][0]["result"]["block_ids"] == list(range(1, 64))
    assert body["results"][2]["result"]["block_ids"] == list(range(63, 0, -1))
    assert await api.queue() == list(range(63, 0, -1))
    s = await api.summary()
    assert s["counters"]["blocks_allocated"] == 50 * 63 == s["counters"]["blocks_freed"]
    api.check()
