"""Many clients at once: the single-writer engine keeps the pool consistent
(paranoid invariants after every operation, engine.check() at the end) and
the counters add up to what the clients were told."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.app.conftest import Api, LiveServer

pytestmark = pytest.mark.anyio

PREFIXES = [list(range(1000 * i, 1000 * i + 24)) for i in range(4)]  # 6 blocks each


@dataclass
class Tally:
    allocated: int = 0
    freed: int = 0
    touched: int = 0
    admitted: int = 0
    finished: int = 0
    refused: int = 0
    admit_refused: int = 0
    hit_tokens: int = 0
    query_tokens: int = 0
    statuses: Counter[int] = field(default_factory=Counter)

    def add(self, other: Tally) -> None:
        for name in (
            "allocated",
            "freed",
            "touched",
            "admitted",
            "finished",
            "refused",
            "admit_refused",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.hit_tokens += other.hit_tokens
        self.query_tokens += other.query_tokens
        self.statuses.update(other.statuses)

    def count_admission(self, body: dict[str, Any], tokens: list[int]) -> str:
        """Count an admitted request (201) as the client was told; its id."""
        self.admitted += 1
        self.allocated += body["num_new_blocks"]
        self.touched += body["num_hit_blocks"]
        self.hit_tokens += body["num_computed_tokens"]
        self.query_tokens += len(tokens)
        rid: str = body["request_id"]
        return rid


def prompt(rng: random.Random) -> list[int]:
    return rng.choice(PREFIXES) + [rng.randrange(50_000) for _ in range(rng.randint(1, 14))]


async def async_client_session(api: Api, seed: int, rounds: int) -> Tally:
    """One client: raw blocks and requests, interleaved, everything returned."""
    rng = random.Random(seed)
    t = Tally()
    c = api.client
    for _ in range(rounds):
        n = rng.randint(1, 6)
        r = await c.post("/api/pool/allocate", json={"num_blocks": n})
        t.statuses[r.status_code] += 1
        ids: list[int] = []
        if r.status_code == 200:
            ids = r.json()["block_ids"]
            assert len(ids) == n == len(set(ids))
            t.allocated += n
        else:
            assert r.json()["error"]["code"] == "not_enough_blocks"
            t.refused += 1
        tokens = prompt(rng)
        r = await c.post("/api/requests", json={"token_ids": tokens})
        t.statuses[r.status_code] += 1
        rid = None
        if r.status_code == 201:
            rid = t.count_admission(r.json(), tokens)
            r = await c.post(f"/api/requests/{rid}/tokens", json={"token_ids": [1, 2, 3, 4, 5]})
            t.statuses[r.status_code] += 1
            if r.status_code == 200:
                t.allocated += sum(len(x) for x in r.json()["new_block_ids"])
        else:
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "not_enough_blocks"
            t.refused += 1
            t.admit_refused += 1
        if ids:
            rng.shuffle(ids)
            r = await c.post("/api/pool/free", json={"block_ids": ids})
            assert r.status_code == 200, r.text
            t.freed += len(ids)
        if rid is not None:
            r = await c.post(f"/api/requests/{rid}/finish")
            assert r.status_code == 200, r.text
            t.freed += sum(len(x) for x in r.json()["freed_block_ids"])
            t.finished += 1
    return t


def check_totals(s: dict[str, Any], total: Tally, num_blocks: int) -> None:
    c = s["counters"]
    assert c["blocks_allocated"] == total.allocated
    assert c["blocks_freed"] == total.freed
    assert c["blocks_touched"] == total.touched
    assert c["requests_admitted"] == total.admitted == total.finished
    assert c["requests_finished"] == total.finished
    assert s["prefix_cache"]["hits_tokens"] == total.hit_tokens
    assert s["prefix_cache"]["queries_tokens"] == total.query_tokens
    assert s["running_requests"] == 0
    assert s["blocks"]["in_use"] == 0
    assert s["num_free_blocks"] == num_blocks - 1
    assert total.hit_tokens > 0  # the shared prefixes were shared


@pytest.mark.app_settings(num_blocks=256)
async def test_hundreds_of_concurrent_calls(api: Api) -> None:
    sessions = [async_client_session(api, seed, rounds=8) for seed in range(40)]
    tallies = await asyncio.gather(*sessions)
    total = Tally()
    for t in tallies:
        total.add(t)
    assert sum(total.statuses.values()) >= 40 * 8 * 2
    assert 500 not in total.statuses
    s = await api.summary()
    check_totals(s, total, 256)
    assert s["counters"]["requests_refused"] == total.admit_refused
    assert total.refused > 0  # the pool was contended
    api.check()


async def test_concurrent_allocations_never_share_a_block(api: Api) -> None:
    results = await asyncio.gather(
        *[api.client.post("/api/pool/allocate", json={"num_blocks": 3}) for _ in range(25)]
    )
    ok = [r.json()["block_ids"] for r in results if r.status_code == 200]
    refused = [r for r in results if r.status_code == 409]
    assert len(ok) == 21 and len(refused) == 4  # 63 free blocks: 21 x 3
    got = [b for ids in ok for b in ids]
    assert sorted(got) == list(range(1, 64))
    # each call is applied whole: it got 3 consecutive blocks from the head
    for ids in ok:
        assert ids == [ids[0], ids[0] + 1, ids[0] + 2]
    for r in refused:
        assert r.json()["error"]["details"] == {"requested": 3, "free": 0}
    frees = await asyncio.gather(
        *[api.client.post("/api/pool/free", json={"block_ids": ids[::-1]}) for ids in ok]
    )
    assert all(r.status_code == 200 for r in frees)
    # each free appended its 3 blocks together, in the given order
    q = await api.queue()
    chunks = sorted(q[i : i + 3] for i in range(0, 63, 3))
    assert chunks == sorted(ids[::-1] for ids in ok)
    api.check()


async def test_concurrent_reads_during_writes(api: Api) -> None:
    async def writer() -> None:
        for _ in range(30):
            ids = (await api.client.post("/api/pool/allocate", json={"num_blocks": 4})).json()
            await api.client.post("/api/pool/free", json={"block_ids": ids["block_ids"]})

    async def reader() -> None:
        for _ in range(30):
            s = (await api.client.get("/api/summary")).json()
            b = s["blocks"]
            assert b["null"] + b["in_use"] + b["cached"] + b["empty"] == 64
            assert s["num_free_blocks"] == b["cached"] + b["empty"]
            q = (await api.client.get("/api/queue", params={"limit": 100})).json()
            assert q["total"] == len(q["items"])
            assert len({i["block_id"] for i in q["items"]}) == q["total"]

    await asyncio.gather(*[writer() for _ in range(4)], *[reader() for _ in range(4)])
    s = await api.summary()
    assert s["counters"]["blocks_allocated"] == s["counters"]["blocks_freed"] == 4 * 30 * 4
    api.check()


def thread_client(url: str, seed: int, rounds: int, out: list[Tally], errors: list[str]) -> None:
    rng = random.Random(seed)
    t = Tally()
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            for _ in range(rounds):
                ids: list[int] = []
                r = c.post("/api/pool/allocate", json={"num_blocks": rng.randint(1, 8)})
                t.statuses[r.status_code] += 1
                if r.status_code == 200:
                    ids = r.json()["block_ids"]
                    t.allocated += len(ids)
                    if rng.random() < 0.5:
                        r = c.post("/api/pool/touch", json={"block_ids": ids[:1]})
                        assert r.status_code == 200, r.text
                        t.touched += 1
                        ids.append(ids[0])
                tokens = prompt(rng)
                r = c.post("/api/requests", json={"token_ids": tokens})
                t.statuses[r.status_code] += 1
                rid = None
                if r.status_code == 201:
                    rid = t.count_admission(r.json(), tokens)
                else:
                    assert r.status_code == 409, r.text
                    t.admit_refused += 1
                if ids:
                    r = c.post("/api/pool/free", json={"block_ids": ids})
                    assert r.status_code == 200, r.text
                    t.freed += len(ids)
                if rid is not None:
                    r = c.post(f"/api/requests/{rid}/finish")
                    assert r.status_code == 200, r.text
                    t.freed += sum(len(x) for x in r.json()["freed_block_ids"])
                    t.finished += 1
    except Exception as exc:  # reported by the test
        errors.append(repr(exc))
    out.append(t)


@pytest.mark.app_settings(num_blocks=512)
def test_real_server_with_client_threads(live_server: LiveServer) -> None:
    out: list[Tally] = []
    errors: list[str] = []
    threads = [
        threading.Thread(target=thread_client, args=(live_server.url, seed, 40, out, errors))
        for seed in range(8)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=240)
    assert not errors, errors
    assert len(out) == 8
    total = Tally()
    for t in out:
        total.add(t)
    assert 500 not in total.statuses
    assert total.admitted > 0
    live_server.call(live_server.engine.check)
    with httpx.Client(base_url=live_server.url) as c:
        s = c.get("/api/summary").json()
        check_totals(s, total, 512)
        assert s["counters"]["requests_refused"] == total.admit_refused
        m = c.get("/metrics").text
    assert f"blockpool_blocks_allocated_total {float(total.allocated)}" in m
