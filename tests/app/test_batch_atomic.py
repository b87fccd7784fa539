"""/api/batch by default: all or nothing.  A refusal that depends on the pool's
state (a free block freed, a block touched twice over its holder, too few
blocks) anywhere in the batch leaves the pool, the manager, the counters, the
event log and the recording exactly as they were, and the answer is that
refusal in the one error shape, naming the operation."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conftest import Api, assert_error

pytestmark = pytest.mark.anyio


def _recorded(api: Api) -> int | None:
    an = api.engine.analysis
    rec = an.recorder if an is not None else None
    return rec.seq if rec is not None else None


@pytest.mark.parametrize(
    ("bad", "code", "fragment"),
    [
        ({"op": "free", "block_ids": [9]}, "conflict", "block 9 is already free"),
        ({"op": "touch", "block_ids": [0]}, "conflict", "null block"),
        ({"op": "allocate", "num_blocks": 60}, "not_enough_blocks", "only 56 are free"),
        ({"op": "finish", "request_id": "nobody"}, "not_found", "no running request"),
        ({"op": "reset"}, "reset_refused", "still held"),
    ],
)
async def test_a_refused_op_anywhere_changes_nothing(
    api: Api, bad: dict[str, Any], code: str, fragment: str
) -> None:
    await api.ok("POST", "/api/pool/allocate", {"num_blocks": 2})  # blocks 1, 2 held
    before = api.fingerprint()
    queue = await api.queue()
    events = await api.events()
    counters = dict((await api.summary())["counters"])
    failed_before = api.engine.counters.ops_failed
    recorded = _recorded(api)
    ops = [
        {"op": "allocate", "num_blocks": 3},
        {"op": "admit", "request_id": "a", "token_ids": list(range(9))},
        {"op": "free", "block_ids": [1]},
        bad,
        {"op": "allocate", "num_blocks": 1},
    ]
    status = 404 if code == "not_found" else 409
    err = assert_error(await api.post("/api/batch", {"ops": ops}), status, code)
    assert err["message"].startswith("ops[3]: ") and fragment in err["message"], err
    assert "nothing changed" in err["message"]
    assert err["details"]["op_index"] == 3 and err["details"]["op"] == bad["op"]
    # nothing of ops 0..2 happened
    assert api.fingerprint() == before
    assert await api.queue() == queue
    assert await api.events() == events
    after = dict((await api.summary())["counters"])
    assert api.engine.counters.ops_failed == failed_before + 1
    for k in ("blocks_allocated", "blocks_freed", "requests_admitted", "resets"):
        assert after[k] == counters[k], k
    assert _recorded(api) == recorded
    api.check()


async def test_a_batch_that_fits_applies_whole(api: Api) -> None:
    ops = [
        {"op": "allocate", "num_blocks": 3},
        {"op": "cache", "block_ids": [1, 2], "token_ids": list(range(8))},
        {"op": "free", "block_ids": [3, 2, 1]},
        {"op": "admit", "request_id": "b1", "token_ids": list(range(10))},
        {"op": "prefix_lookup", "token_ids": list(range(12))},
        {"op": "finish", "request_id": "b1"},
    ]
    body = await api.ok("POST", "/api/batch", {"ops": ops})
    assert body["applied"] == 6 and body["failed"] == 0 and body["errors"] is False
    r = body["results"]
    assert r[0]["result"] == {"block_ids": [1, 2, 3], "evicted": []}
    assert r[2]["result"] == {"freed": [3, 2, 1], "now_free": [3, 2, 1]}
    # the request reuses blocks 1 and 2 (cached), then takes block 4 from the head
    assert r[3]["result"]["block_ids"] == [[1, 2, 4]] and r[3]["result"]["num_hit_blocks"] == 2
    assert r[5]["result"]["freed_block_ids"] == [[4, 2, 1]]
    assert await api.queue() == [*range(5, 64), 3, 4, 2, 1]
    api.check()


async def test_one_mutating_op_refused_is_the_answer(api: Api) -> None:
    before = api.fingerprint()
    ops = [{"op": "prefix_lookup", "token_ids": [1, 2, 3]}, {"op": "free", "block_ids": [4]}]
    err = assert_error(await api.post("/api/batch", {"ops": ops}), 409, "conflict")
    assert err["details"]["op_index"] == 1
    assert api.fingerprint() == before
    api.check()


async def test_partial_application_stays_available(api: Api) -> None:
    ops = [{"op": "allocate", "num_blocks": 2}, {"op": "free", "block_ids": [9]}]
    body = await api.ok("POST", "/api/batch", {"ops": ops, "on_error": "stop"})
    assert body["applied"] == 1 and body["results"][1]["error"]["code"] == "conflict"
    assert await api.queue() == list(range(3, 64))
    api.check()
