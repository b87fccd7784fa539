"""``AsBuilt[Shape]`` (app/api/declare.py): a route's response model is the
``TypedDict`` its handler builds, documented by that shape and sent as built:
no validation, the dict's own JSON (extra keys and key order kept)."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from app.api.declare import AsBuilt
from app.main import create_app
from app.pool.views.operations import Batch
from blockpool.runtime.ops import Allocated, Lookup


def test_as_built_is_not_validated_and_sent_as_the_dict() -> None:
    ta: TypeAdapter[Any] = TypeAdapter(AsBuilt[Allocated])
    built = {"evicted": [], "block_ids": [1, 2], "later": {"k": 1}}
    assert ta.validate_python(built) is built
    assert ta.dump_json(built) == b'{"evicted":[],"block_ids":[1,2],"later":{"k":1}}'


def test_as_built_documents_the_shape() -> None:
    for shape in (Allocated, Lookup, Batch):
        mode = "serialization"
        assert TypeAdapter(AsBuilt[shape]).json_schema(mode=mode) == TypeAdapter(shape).json_schema(
            mode=mode
        )


def test_the_operations_routes_declare_the_library_shapes() -> None:
    doc = create_app().openapi()
    ok = doc["paths"]["/api/pool/allocate"]["post"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Allocated"}
    schema = doc["components"]["schemas"]["Allocated"]
    assert schema["description"] == Allocated.__doc__
    assert schema["properties"]["evicted"]["description"] == "cached blocks whose hash was dropped"


def test_a_shape_extended_by_the_service_keeps_its_field_descriptions() -> None:
    # pydantic reads the attribute docstrings of the class itself only: a
    # description on a field the library's shape declares would be lost in
    # the service's subclass (RequestMisses, Regret)
    from app.pool.views.analysis import Regret, RequestMisses

    for cls in (RequestMisses, Regret):
        (base,) = cls.__orig_bases__
        mode = "serialization"
        ours = TypeAdapter(cls).json_schema(mode=mode)["properties"]
        theirs = TypeAdapter(base).json_schema(mode=mode)["properties"]
        for name, field in theirs.items():
            assert ours[name].get("description") == field.get("description"), (cls, name)
