"""KV-event tests: no BLOCKPOOL_* environment leaks into the settings."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("BLOCKPOOL_"):
            monkeypatch.delenv(key)
