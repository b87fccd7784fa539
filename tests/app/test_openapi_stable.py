"""``/openapi.json`` stays stable for a client generated from ``/docs``: only
additions.

tests/app/data/openapi_main.json holds what main's document has: its
component schema names (a response model's class name is its component
name, so renaming the class renames the client's type) and each operation
with the schema ``$ref`` of its success responses.  The app's document must
still have every one of them; new schemas and operations are fine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app

BASELINE = Path(__file__).parent / "data" / "openapi_main.json"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


@pytest.fixture(scope="module")
def baseline() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(BASELINE.read_text())
    return data


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app().openapi()


def _operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        f"{method.upper()} {path}": op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    }


def _ref(response: dict[str, Any]) -> set[str]:
    return {
        c["schema"]["$ref"]
        for c in response.get("content", {}).values()
        if "$ref" in c.get("schema", {})
    }


def test_the_baseline_is_main_s_document(baseline: dict[str, Any]) -> None:
    assert len(baseline["schemas"]) == 83
    assert baseline["schemas"] == sorted(baseline["schemas"])
    assert len(baseline["operations"]) == 49
    assert baseline["operations"]["POST /api/requests"] == {"201": "#/components/schemas/Admitted"}


def test_every_component_schema_keeps_its_name(
    baseline: dict[str, Any], document: dict[str, Any]
) -> None:
    missing = sorted(set(baseline["schemas"]) - set(document["components"]["schemas"]))
    assert missing == []


def test_every_operation_is_still_there(baseline: dict[str, Any], document: dict[str, Any]) -> None:
    missing = sorted(set(baseline["operations"]) - set(_operations(document)))
    assert missing == []


def test_every_success_response_keeps_its_schema(
    baseline: dict[str, Any], document: dict[str, Any]
) -> None:
    ops = _operations(document)
    changed = {}
    for name, expected in baseline["operations"].items():
        responses = ops.get(name, {}).get("responses", {})
        for status, ref in expected.items():
            found = _ref(responses.get(status, {}))
            if found != {ref}:
                changed[f"{name} {status}"] = (ref, sorted(found))
    assert changed == {}


def test_a_renamed_model_is_caught(baseline: dict[str, Any], document: dict[str, Any]) -> None:
    """The checks see a rename: the document with one schema renamed fails."""
    renamed = json.loads(json.dumps(document).replace('schemas/Reset"', 'schemas/CacheReset"'))
    renamed["components"]["schemas"]["CacheReset"] = renamed["components"]["schemas"].pop("Reset")
    assert "Reset" in set(baseline["schemas"]) - set(renamed["components"]["schemas"])
    with pytest.raises(AssertionError):
        test_every_success_response_keeps_its_schema(baseline, renamed)
