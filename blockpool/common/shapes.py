"""How the library declares the shape of what it returns as data: a
``TypedDict`` built where the data is made (mypy checks the builder), the
one declaration of that shape.  The service's routes declare these as
their response models: pydantic reads the class's docstring as the
schema's description and each field's docstring as the field's (``shape``
sets the config that asks for it; a ``ConfigDict`` is a plain dict, so
nothing here imports pydantic).  Where the schema declares defaults (which a
``TypedDict`` cannot), the shape is a stdlib ``@dataclass`` marked the same
way: pydantic reads its config, defaults and field docstrings, and sends its
fields in their order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from typing import TypedDict
else:
    try:  # pydantic reads only typing_extensions' TypedDict on 3.11 (and depends on it)
        from typing_extensions import TypedDict
    except ImportError:  # the library alone: nothing reads the schema
        from typing import TypedDict

# pydantic's config for a shape: a shape names what is there today without
# promising that nothing will ever be added (``extra``); the docstrings of the
# fields are their descriptions.
SHAPE_CONFIG: dict[str, Any] = {"extra": "allow", "use_attribute_docstrings": True}

S = TypeVar("S")


def shape(cls: type[S]) -> type[S]:
    """Mark a ``TypedDict`` or a dataclass as a shape (pydantic's ``with_config``)."""
    cast(Any, cls).__pydantic_config__ = SHAPE_CONFIG
    return cls


__all__ = ["SHAPE_CONFIG", "TypedDict", "shape"]
