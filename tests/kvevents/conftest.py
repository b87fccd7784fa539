"""KV-event tests: no BLOCKPOOL_* environment leaks into the settings."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("BLOCKPOOL_"):
            monkeypatch.delenv(key)
    yield
