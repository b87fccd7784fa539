"""Flags declared as data: a ``Flag`` a row (its option and argparse's
keywords, only those it sets), added in order by ``add_flags``; ``switch``
gives the ``--x``/``--no-x`` pair of a setting left None unless given."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

UNSET: Any = object()  # a keyword the row leaves to argparse


@dataclass(frozen=True)
class Flag:
    """One ``add_argument`` call: ``option`` and the keywords it gives."""

    option: str
    help: str | None = UNSET
    dest: str = UNSET
    type: Callable[[str], Any] = UNSET
    metavar: str = UNSET
    action: str = UNSET
    choices: Sequence[str] = UNSET
    default: Any = UNSET
    nargs: str = UNSET

    def keywords(self) -> dict[str, Any]:
        """The keywords this row sets, for ``add_argument``."""
        given = {
            "help": self.help,
            "dest": self.dest,
            "type": self.type,
            "metavar": self.metavar,
            "action": self.action,
            "choices": self.choices,
            "default": self.default,
            "nargs": self.nargs,
        }
        return {k: v for k, v in given.items() if v is not UNSET}


def add_flags(p: argparse._ActionsContainer, flags: Iterable[Flag]) -> None:
    """Each row's flag on ``p`` (a parser or a group), in order."""
    for f in flags:
        p.add_argument(f.option, **f.keywords())


def switch(name: str, dest: str, help_text: str) -> tuple[Flag, Flag]:
    """``--name`` (True) and ``--no-name`` (False) into ``dest``, None unless given."""
    return (
        Flag(f"--{name}", help_text, dest=dest, action="store_true", default=None),
        Flag(f"--no-{name}", dest=dest, action="store_false", default=None),
    )


LOG_LEVEL = Flag(
    "--log-level",
    "log level (default: %(default)s)",
    default="info",
    choices=["debug", "info", "warning", "error"],
)
