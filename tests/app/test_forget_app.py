"""A mirror's service rebuilt in the same process lets the last one's engine
and pool go: FastAPI's caches of callables would keep them alive."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from fastapi import FastAPI

from app.cli.forget_app import FASTAPI_CALLABLE_CACHES, forget_served_app
from tests.app.conftest import assert_error, make_app, running


def test_a_stopped_app_is_freed_once_forgotten() -> None:
    app = make_app(demo=False)

    async def serve(served: FastAPI) -> None:
        async with served.router.lifespan_context(served):
            served.state.engine.check()

    asyncio.run(serve(app))
    engine = weakref.ref(app.state.engine)
    pool = weakref.ref(app.state.engine.pool)
    del app
    gc.collect()
    # FastAPI's caches hold its route closures (if a FastAPI stops doing so,
    # this workaround is no longer needed: app/cli/forget_app.py)
    assert engine() is not None
    assert forget_served_app() == len(FASTAPI_CALLABLE_CACHES)
    assert engine() is None and pool() is None


@pytest.mark.anyio
async def test_a_new_app_serves_after_its_predecessor_was_forgotten() -> None:
    """The caches cleared refill: the next app's routes and dependencies work."""
    forget_served_app()
    app = make_app(demo=False)
    async with running(app) as a:
        r = await a.get("/api/health")
        assert r.status_code == 200, r.text
        assert_error(await a.post("/api/pool/allocate", json={"num_blocks": -1}), 422)
        a.check()
    app.state.engine.check()


class _Linked:
    """A block of the last service's pool: linked both ways."""

    other: object = None


def test_forgetting_collects_the_last_services_garbage_before_the_next_start() -> None:
    """The next service's start freezes what is alive (app/main.py): what the
    last one left as cyclic garbage must be gone by then, not frozen."""
    was = gc.isenabled()
    gc.disable()  # (no automatic collection frees it by chance)
    try:
        a, b = _Linked(), _Linked()
        a.other, b.other = b, a
        left = weakref.ref(a)
        del a, b
        assert left() is not None  # a cycle: only a collection frees it
        forget_served_app()
        assert left() is None
    finally:
        if was:
            gc.enable()
