"""The ``rig`` fixture of the mirror tests: one per free order."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.mirror.rig import Rig


@pytest.fixture(params=["append_all", "uncached_first"])
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    r = Rig(request.param)
    r.start()
    try:
        yield r
    finally:
        r.close()
