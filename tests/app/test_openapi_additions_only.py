"""The whole ``/openapi.json`` only grows: every path, operation, schema,
property and field of tests/app/data/openapi_before.json (the document
before the response models moved next to the code that builds them) is
still in the app's document, equal; new keys anywhere are fine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app

BEFORE = Path(__file__).parent / "data" / "openapi_before.json"


def removals(before: Any, now: Any, where: str = "") -> list[str]:
    """Where ``now`` lacks or changes something ``before`` has: a dict may
    gain keys, anything else must be equal."""
    if isinstance(before, dict):
        if not isinstance(now, dict):
            return [f"{where or '/'}: was an object"]
        out: list[str] = []
        for key, value in before.items():
            if key not in now:
                out.append(f"{where}/{key}: gone")
            else:
                out.extend(removals(value, now[key], f"{where}/{key}"))
        return out
    if isinstance(before, list) and isinstance(now, list) and len(before) == len(now):
        pairs = enumerate(zip(before, now, strict=True))
        return [x for i, (b, n) in pairs for x in removals(b, n, f"{where}[{i}]")]
    return [] if before == now else [f"{where or '/'}: {before!r} -> {now!r}"]


@pytest.fixture(scope="module")
def before() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(BEFORE.read_text())
    return data


def test_the_snapshot_is_the_whole_document(before: dict[str, Any]) -> None:
    assert len(before["paths"]) == 48
    assert len(before["components"]["schemas"]) == 83
    assert "/api/blocks/{block_id}" in before["paths"]


def test_the_document_only_grows(before: dict[str, Any]) -> None:
    assert removals(before, create_app().openapi()) == []


def test_the_diff_sees_a_change_and_allows_an_addition() -> None:
    old = {"a": {"b": [1, {"c": "x"}]}, "d": 1}
    assert removals(old, {"a": {"b": [1, {"c": "x", "new": 2}]}, "d": 1, "e": 3}) == []
    assert removals(old, {"a": {"b": [1, {"c": "y"}]}}) == ["/a/b[1]/c: 'x' -> 'y'", "/d: gone"]
    assert removals(old, {"a": {"b": [1]}, "d": 1}) == ["/a/b: [1, {'c': 'x'}] -> [1]"]
