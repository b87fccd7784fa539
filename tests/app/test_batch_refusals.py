"""One behaviour for a refused all-or-nothing batch, whatever its size: it
counts once in ``operations_refused`` and leaves the pool, the other
counters, the event log and the recording as they were — a batch of one
mutating operation (which used to be applied for real, recorded and counted
twice) exactly like a batch of several (tried on the spare pool)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conftest import Api, assert_error

pytestmark = pytest.mark.anyio

BAD = {"op": "free", "block_ids": [9]}  # block 9 is free: refused (409 conflict)
LOOKUP = {"op": "prefix_lookup", "token_ids": list(range(8))}


def recorded(api: Api) -> int:
    an = api.engine.analysis
    assert an is not None and an.recorder is not None
    seq: int = an.recorder.seq
    return seq


@pytest.mark.parametrize(
    "ops",
    [
        [BAD],
        [LOOKUP, BAD],
        [BAD, LOOKUP],
        [{"op": "allocate", "num_blocks": 2}, BAD],
        [{"op": "allocate", "num_blocks": 2}, LOOKUP, {"op": "touch", "block_ids": [1]}, BAD],
    ],
    ids=["alone", "after-a-lookup", "before-a-lookup", "after-a-write", "after-three"],
)
async def test_a_refused_batch_counts_once_and_records_nothing(
    api: Api, ops: list[dict[str, Any]]
) -> None:
    await api.ok("POST", "/api/pool/allocate", {"num_blocks": 1})  # block 1 held
    before = api.fingerprint()
    events = await api.events()
    counters = dict((await api.summary())["counters"])
    seq = recorded(api)
    err = assert_error(await api.post("/api/batch", {"ops": ops}), 409, "conflict")
    assert err["details"]["op_index"] == ops.index(BAD) and "nothing changed" in err["message"]
    after = dict((await api.summary())["counters"])
    assert after["operations_refused"] == counters["operations_refused"] + 1
    assert after["operations"] == counters["operations"] + 1  # the batch, one unit
    assert recorded(api) == seq  # nothing of the batch in the recording
    assert api.fingerprint() == before and await api.events() == events
    for key in set(after) - {"operations", "operations_refused"}:
        assert after[key] == counters[key], key
    api.check()


async def test_a_refused_operation_alone_is_counted_once_and_recorded(api: Api) -> None:
    counters = dict((await api.summary())["counters"])
    seq = recorded(api)
    assert_error(await api.post("/api/pool/free", {"block_ids": [9]}), 409, "conflict")
    after = dict((await api.summary())["counters"])
    assert after["operations_refused"] == counters["operations_refused"] + 1
    assert recorded(api) == seq + 1  # a request of its own: its refusal is history
    api.check()


async def test_partial_batches_count_each_operation(api: Api) -> None:
    counters = dict((await api.summary())["counters"])
    seq = recorded(api)
    ops = [{"op": "allocate", "num_blocks": 1}, BAD, BAD]
    body = await api.ok("POST", "/api/batch", {"ops": ops, "on_error": "continue"})
    assert body["applied"] == 1 and body["failed"] == 2
    after = dict((await api.summary())["counters"])
    # each refused operation once, as if sent alone (the batch itself succeeded)
    assert after["operations_refused"] == counters["operations_refused"] + 2
    assert recorded(api) == seq + 3
    api.check()
