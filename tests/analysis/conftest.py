"""Fixtures for the analysis tests: engines with a small pool, inline
shadows (deterministic), a fake clock; an ASGI client on such an app."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import blockpool
from app.pool.engine import Engine
from app.pool.schemas import AdmitOp, AllocateOp, AppendOp, EvictOp, FinishOp, FreeOp
from app.shared.settings import Settings
from tests.app.conftest import Api, make_app, running
from tests.conftest import FIXED_SEED

BASE: dict[str, Any] = {
    "num_blocks": 8,
    "block_size": 4,
    "hash_fn": "sha256",
    "hash_seed": FIXED_SEED,
    "storage": False,
    "shadow_mode": "inline",
    "analysis_mode": "inline",
    "metrics_sample_rate": 0.5,
}


class Clock:
    """A wall clock the test moves."""

    def __init__(self, t: float | None = None) -> None:
        # from now on (an engine's first keyframe is stamped before a test's
        # clock is put in)
        self.t = float(int(time.time()) + 1) if t is None else t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make_engine(clock: Clock | None = None, **overrides: Any) -> Engine:
    engine = Engine(Settings(**{**BASE, **overrides}))
    engine.paranoid = True
    if clock is not None and engine.analysis is not None:
        engine.analysis.clock = clock
    return engine


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine_factory(clock: Clock) -> Iterator[Callable[..., Engine]]:
    """Engines built here are checked (pool + engine bookkeeping) at teardown."""
    made: list[Engine] = []

    def factory(**overrides: Any) -> Engine:
        e = make_engine(clock, **overrides)
        made.append(e)
        return e

    yield factory
    for e in made:
        e.check()
        if e.analysis is not None and e.analysis.feeder is not None:
            e.analysis.feeder.check()
        e.analysis and e.analysis.stop()


def admit(e: Engine, rid: str, tokens: list[int], **kw: Any) -> dict[str, Any]:
    return e.apply(AdmitOp(request_id=rid, token_ids=tokens, **kw))


def append(e: Engine, rid: str, tokens: list[int]) -> dict[str, Any]:
    return e.apply(AppendOp(request_id=rid, token_ids=tokens))


def finish(e: Engine, rid: str) -> dict[str, Any]:
    return e.apply(FinishOp(request_id=rid))


def allocate(e: Engine, n: int) -> list[int]:
    ids: list[int] = e.apply(AllocateOp(num_blocks=n))["block_ids"]
    return ids


def free(e: Engine, ids: list[int]) -> None:
    e.apply(FreeOp(block_ids=ids))


def evict(e: Engine, ids: list[int]) -> dict[str, Any]:
    return e.apply(EvictOp(block_ids=ids))


def reasons(e: Engine, rid: str) -> list[str | None]:
    """The reason per prompt block (None = hit)."""
    assert e.analysis is not None
    rm = e.analysis.misses.lookup(rid)
    assert rm is not None, rid
    return [r for r, _ in e.analysis.misses.block_reasons(rm)]


def details(e: Engine, rid: str) -> list[dict[str, Any] | None]:
    assert e.analysis is not None
    rm = e.analysis.misses.lookup(rid)
    assert rm is not None
    return [d for _, d in e.analysis.misses.block_reasons(rm)]


@pytest.fixture
async def aapi(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    """The service on a small pool, inline shadows; checked at teardown."""
    marker = request.node.get_closest_marker("app_settings")
    kw = {
        "shadow_mode": "inline",
        "analysis_mode": "inline",
        "storage": False,
        **(marker.kwargs if marker else {}),
    }
    app = make_app(**kw)
    async with running(app) as a:
        yield a
        a.check()
    app.state.engine.check()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings read BLOCKPOOL_* from the environment: keep tests hermetic;
    the engine sets NONE_HASH globally: put the tests' one back."""
    for key in list(os.environ):
        if key.startswith("BLOCKPOOL_"):
            monkeypatch.delenv(key)
    yield
    blockpool.init_none_hash(blockpool.sha256, seed=FIXED_SEED)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "app_settings(**kw): Settings overrides for the aapi fixture"
    )
