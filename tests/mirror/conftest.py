"""The mirror tests' fixtures: ``rig`` (one per free order), ``keyed`` (an
engine and a mirror sharing a secret), ``quick_resync``, ``pass_clock`` (the
clock the plugin's forward passes are timed by, moved by the test)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.mirror import client as mirror_client
from app.mirror import snapshot_request as mirror_snapshot_request
from blockpool_vllm import forward_pass
from tests.mirror.rig import SECRET, Rig


class PassClock:
    """blockpool_vllm/forward_pass.py's clock (ns), as the test moves it."""

    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns


@pytest.fixture
def pass_clock(monkeypatch: pytest.MonkeyPatch) -> PassClock:
    c = PassClock()
    monkeypatch.setattr(forward_pass, "_now", c)
    return c


@pytest.fixture(params=["append_all", "uncached_first"])
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    r = Rig(request.param)
    r.start()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
async def keyed() -> AsyncIterator[Rig]:
    """An engine and a mirror sharing one secret."""
    r = Rig("uncached_first", key=SECRET)
    r.start()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def quick_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine that does not answer is given up on soon (and retried soon)."""
    monkeypatch.setattr(mirror_snapshot_request, "SNAPSHOT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(mirror_client, "RETRY_S", 0.2)
    monkeypatch.setattr(mirror_client, "RETRY_MAX_S", 0.5)
