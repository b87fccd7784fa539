"""The request bodies are derived from the operations' records: same names,
fields, bounds, defaults and documentation (app/pool/schemas.py), and a body
arrives at the route as its record."""

from __future__ import annotations

import inspect
from typing import Any, get_args

import msgspec
import pytest
from pydantic import ValidationError

from app.pool.schemas import BODIES, BatchRequest, to_op
from blockpool.runtime.ops import (
    ENGINE_SPECS,
    OP_BY_NAME,
    READ_ONLY,
    SPEC_OF,
    SPECS,
    Op,
    op_from_json,
)


def _plain(schema: Any) -> Any:
    """A JSON schema without the titles pydantic adds."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_the_body_schema_is_the_records_schema(spec: Any) -> None:
    record = spec.record
    mine = _plain(msgspec.json.schema(record)["$defs"][record.__name__])
    body = _plain(BODIES[record].model_json_schema())
    assert BODIES[record].__name__ == record.__name__  # the OpenAPI component's name
    assert body.pop("type") == mine.pop("type") == "object"
    assert body.pop("description") == mine.pop("description") == inspect.cleandoc(record.__doc__)
    assert body.pop("required", []) == mine.pop("required", [])
    assert body.pop("additionalProperties") is mine.pop("additionalProperties") is False
    props, my_props = body.pop("properties"), mine.pop("properties")
    assert list(props) == list(my_props)  # same fields, same order (op first)
    op, my_op = props.pop("op"), my_props.pop("op")
    assert op["const"] == my_op["enum"][0] == spec.name == op["default"]
    assert props == my_props
    assert body == mine == {}


def test_the_registry_lists_every_operation_once() -> None:
    assert {s.record for s in (*SPECS, *ENGINE_SPECS)} == set(get_args(Op))
    assert len({s.name for s in SPECS}) == len(SPECS) == len(OP_BY_NAME)
    # an engine's records: not the API's, each the API operation of its name
    # (its change too), exported as that one
    assert not {s.record for s in ENGINE_SPECS} & set(OP_BY_NAME.values()) & set(BODIES)
    for s in ENGINE_SPECS:
        assert s.public is not None
        assert SPEC_OF[OP_BY_NAME[s.name]].change is s.change
    assert set(READ_ONLY) == {OP_BY_NAME["lookup"], OP_BY_NAME["prefix_lookup"]}
    assert all((s.change is None) == s.read_only for s in SPECS)
    assert all(s.change.value == s.name for s in SPECS if s.change is not None)


def test_a_body_arrives_as_its_record() -> None:
    batch = BatchRequest.model_validate(
        {
            "ops": [
                {"op": "allocate", "num_blocks": 2},
                {"op": "cache", "block_ids": [1], "block_hashes": ["ab"], "group_id": 1},
                {"op": "lookup", "block_hash": "ab"},
                {"op": "admit", "token_ids": [1, 2, 3]},
            ]
        }
    )
    ops = batch.operations()
    assert [type(o) for o in ops] == [
        OP_BY_NAME[n] for n in ("allocate", "cache", "lookup", "admit")
    ]
    assert ops[1] == op_from_json(
        {"op": "cache", "block_ids": [1], "block_hashes": ["ab"], "group_id": 1}
    )
    assert ops[2].group_ids == [0]  # type: ignore[union-attr]
    assert ops[3].request_id is None  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="not an operation body"):
        to_op(batch)


@pytest.mark.parametrize(
    "bad",
    [
        {"op": "allocate", "num_blocks": True},  # strict: no boolean for a number
        {"op": "allocate", "num_blocks": -1},
        {"op": "allocate", "num_blocks": 2**31},
        {"op": "free", "block_ids": [1], "extra": 1},
        {"op": "cache", "block_ids": []},
        {"op": "lookup", "block_hash": "abc"},
        {"op": "lookup", "block_hash": "ab", "group_ids": list(range(65))},
        {"op": "admit", "token_ids": [1], "request_id": "has space"},
        {"op": "finish"},
    ],
)
def test_the_body_and_the_record_refuse_the_same(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BODIES[OP_BY_NAME[bad["op"]]].model_validate(bad)
    with pytest.raises(ValueError, match=f"operation '{bad['op']}'"):
        op_from_json(bad)
