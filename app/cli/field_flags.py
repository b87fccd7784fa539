"""Flags generated from a request's fields: a dataclass field with ``help``
(and ``metavar``) in its metadata is ``--its-name`` (or the ``flag`` of its
metadata: ``--no-chunked-prefill``); the type gives argparse its ``type`` (a
``bool`` is a switch: one that turns it on, or off when its default is
True; ``bool | None`` a switch left None unless given, setting False when
its flag is ``--no-x``; ``X | None`` is ``X`` with no default), a ``Literal``
its choices (``off`` in the metadata: a second flag, ``(option, help)``,
that sets it False), the
field its default.  So a flag's
name, type, choices and default cannot drift from the request it fills."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal, Union


def flag(text: str, metavar: str | None = None, option: str | None = None) -> dict[str, Any]:
    """A field's flag metadata: its help, its placeholder, its option when
    not ``--its-name``."""
    return {"help": text, "metavar": metavar, "flag": option}


def _kwargs(f: dataclasses.Field[Any], tp: Any, option: str) -> dict[str, Any]:
    out: dict[str, Any] = {"help": f.metadata["help"]}
    if tp is bool:
        out["action"] = "store_false" if f.default else "store_true"
        return out
    if typing.get_origin(tp) in (Union, types.UnionType):
        (tp,) = (a for a in typing.get_args(tp) if a is not type(None))
        if tp is bool:  # None unless given
            out["action"] = "store_false" if option.startswith("--no-") else "store_true"
            out["default"] = None
            return out
    if typing.get_origin(tp) is Literal:
        out["choices"] = list(typing.get_args(tp))
    elif tp is not str:
        out["type"] = tp
    out["default"] = f.default
    if f.metadata.get("metavar") is not None:
        out["metavar"] = f.metadata["metavar"]
    return out


def flag_fields(cls: type[Any]) -> list[str]:
    """The fields of ``cls`` that are flags, in their order."""
    return [f.name for f in dataclasses.fields(cls) if "help" in f.metadata]


def add_field_flags(
    group: argparse._ActionsContainer, cls: type[Any], names: Sequence[str] | None = None
) -> None:
    """``--name`` for each flag field of the dataclass ``cls`` (``names``: those,
    in that order)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in flag_fields(cls) if names is None else names:
        f = fields[name]
        option = f.metadata.get("flag") or f"--{name.replace('_', '-')}"
        group.add_argument(option, dest=name, **_kwargs(f, hints[name], option))
        if f.metadata.get("off") is not None:  # a second switch that sets it False
            off_option, off_help = f.metadata["off"]
            group.add_argument(off_option, dest=name, action="store_false", help=off_help)


def from_args(cls: type[Any], args: argparse.Namespace, **given: Any) -> Any:
    """An instance of ``cls`` from the parsed flags of the same names
    (``given``: the fields set otherwise)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in given]
    return cls(**given, **{n: getattr(args, n) for n in names})
