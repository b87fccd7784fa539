"""analysis_mode="worker": a replica in the worker process, fed the recorded
operations, answers exactly as the inline analysis does."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from app.analysis.host import PoolJumps
from app.pool.engine import Engine
from app.shared.errors import NotFound, OperationError
from tests.analysis.conftest import Clock, admit, allocate, append, evict, finish, free
from tests.app.conftest import Api, assert_error

Factory = Callable[..., Engine]


def drive(e: Engine, clock: Clock, seed: int) -> None:
    rng = random.Random(seed)
    docs = [[rng.randrange(60) for _ in range(rng.randint(3, 30))] for _ in range(6)]
    running: list[str] = []
    for step in range(300):
        clock.advance(0.25)
        x = rng.random()
        try:
            if x < 0.3:
                rid = f"r{step}"
                extra: dict[str, Any] = rng.choice([{}, {}, {"cache_salt": "t"}])
                admit(e, rid, rng.choice(docs) + [rng.randrange(60)] * rng.randint(0, 5), **extra)
                running.append(rid)
            elif x < 0.6 and running:
                append(e, rng.choice(running), [rng.randrange(60)] * rng.randint(1, 6))
            elif x < 0.85 and running:
                finish(e, running.pop(rng.randrange(len(running))))
            elif x < 0.92:
                free(e, allocate(e, rng.randint(1, 3)))
            else:
                evict(e, rng.sample(range(1, e.pool.num_gpu_blocks), 2))
        except OperationError:
            pass
        if step % 20 == 0:
            e.tick()
    e.tick()


def test_the_replica_answers_as_the_inline_analysis(engine_factory: Factory, clock: Clock) -> None:
    inline = engine_factory(num_blocks=40, analysis_mode="inline")
    worker = engine_factory(num_blocks=40, analysis_mode="worker")
    # the worker's engine only records (its runtime's observer hears only a
    # jump of the pool: a mirror's resync, for the replica)
    assert inline.runtime.observers == (inline.analysis.inline,)
    assert [type(o) for o in worker.runtime.observers] == [PoolJumps]
    wan = worker.analysis
    assert wan is not None and wan.remote is not None
    wan.start()
    drive(inline, clock, 3)
    clock.t -= 300 * 0.25  # the same times for the second run
    drive(worker, clock, 3)
    assert wan.remote.wait_idle(30), wan.remote.snapshot()
    ian = inline.analysis
    assert ian is not None

    async def ask(kind: str, **kw: Any) -> tuple[Any, Any]:
        a, b = await ian.query(kind, **kw), await wan.query(kind, **kw)
        assert a.pop("worker") is None and b.pop("worker")["lag_ops"] == 0
        return a, b

    for kind, kw in (("misses", {"limit": 50}), ("regret", {"limit": 20})):
        a, b = asyncio.run(ask(kind, **kw))
        assert a == b, kind
    a, b = asyncio.run(ask("request_misses", rid="r3"))
    assert a == b
    with pytest.raises(NotFound):
        asyncio.run(wan.query("request_misses", rid="nobody"))
    # pushed without asking: the stream section, Prometheus figures, reasons
    sa, sb = ian.stream_section(), wan.stream_section()
    assert sb is not None
    for key in ("misses", "miss_tokens", "hit_blocks", "regrets", "evictions"):
        assert sa[key] == sb[key], key  # type: ignore[index]
    pa, pb = ian.prom_state(), wan.prom_state()
    assert pb is not None and pa is not None
    assert pa["blocks"] == pb["blocks"] and pa["regret_gap"] == pb["regret_gap"]
    rid = next(iter(wan.remote.reasons))
    assert wan.block_reasons(rid) == ian.block_reasons(rid)
    # the replica's shadows saw the same request stream as the inline ones
    a, b = asyncio.run(ask("shadows"))
    assert a["shadows"] == b["shadows"] and len(b["shadows"]) == 6
    assert wan.remote.snapshot()["resyncs"] == 0


def test_a_lagging_replica_restarts_from_a_new_keyframe(
    engine_factory: Factory,
    clock: Clock,  # noqa: ARG001 fixture used for its side effect
) -> None:
    e = engine_factory(num_blocks=40, analysis_mode="worker", shadow_max_lag=100)
    an = e.analysis
    assert an is not None and an.remote is not None
    an.start()
    for i in range(120):  # more than the bound in one tick
        admit(e, f"a{i}", [1, 2, 3, 4, 5])
        finish(e, f"a{i}")
    e.tick()
    assert an.remote.dropped == 240 and an.remote.need_resync
    admit(e, "late", [9] * 9)
    e.tick()  # resync: a new replica from the state now
    admit(e, "later", [9] * 9)
    e.tick()
    assert an.remote.wait_idle(30)
    assert an.remote.resyncs == 1
    assert [r for r, _ in an.block_reasons("later")] == [None, None, "block_size_floor"]


@pytest.mark.anyio
@pytest.mark.app_settings(analysis_mode="worker")
async def test_rest_in_worker_mode(aapi: Api) -> None:
    await aapi.admit([1, 2, 3, 4, 5, 6], request_id="a")
    await aapi.finish("a")
    await aapi.admit([1, 2, 3, 4, 5, 6, 7, 8, 9], request_id="b")
    body = await aapi.ok("GET", "/api/misses")  # asked after every recorded operation
    assert body["admissions"] == 2 and body["hit"]["blocks"] == 1
    one = await aapi.ok("GET", "/api/misses/requests/b")
    assert [x["reason"] for x in one["blocks"]] == [None, "block_size_floor", "block_size_floor"]
    assert_error(await aapi.get("/api/misses/requests/zz"), 404, "not_found")
    r = await aapi.ok("GET", "/api/regret")
    assert r["regrets_total"] == 0
    s = await aapi.ok("GET", "/api/shadows")
    assert s["mode"] == "inline"  # the replica's own (in the worker)
    an = aapi.engine.analysis
    assert an is not None and an.remote is not None
    remote = an.remote
    async with asyncio.timeout(60):  # a deadline: the reasons come with the batch replies
        while not remote.reasons.get("b"):
            await asyncio.sleep(0.01)
    d = await aapi.ok("GET", "/api/requests/b")
    assert [x["reason"] for x in d["blocks"]] == [None, "block_size_floor", "block_size_floor"]
    text = (await aapi.get("/metrics")).text
    assert "blockpool_analysis_lag_ops" in text and "blockpool_prefix_misses_total" in text
