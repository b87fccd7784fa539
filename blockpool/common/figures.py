"""Counters declared once, as dataclass fields with their help text: the same
figures feed a part's REST view (``rest_view``), its ``/metrics`` readings
(``totals``, with ``helps`` as HELP) and its attributes; ``Figures`` is a
part's ``/metrics`` source (its readings and their HELP).

    @dataclass
    class Counts:
        drops: int = counter("Batches dropped: the queue was full.")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


def counter(help_text: str, *, rest: str | None = None, metric: str | None = "") -> Any:
    """A figure field (starts at 0).  ``rest``: its key in ``rest_view``
    (default: the field's name); ``metric``: its ``/metrics`` reading
    (default ``name_total``; None: not exported)."""
    return field(default=0, metadata={"help": help_text, "rest": rest, "metric": metric})


def _metric(f: Any) -> str | None:
    name: str | None = f.metadata["metric"]
    return f"{f.name}_total" if name == "" else name


def rest_view(counts: Any) -> dict[str, int]:
    """The figures as REST shows them."""
    return {f.metadata["rest"] or f.name: getattr(counts, f.name) for f in fields(counts)}


def totals(counts: Any) -> dict[str, int]:
    """``{metric name: value}`` of the exported figures."""
    return {m: getattr(counts, f.name) for f in fields(counts) if (m := _metric(f)) is not None}


def helps(counts_cls: Any) -> dict[str, str]:
    """``{metric name: help}`` of the exported figures."""
    return {m: f.metadata["help"] for f in fields(counts_cls) if (m := _metric(f)) is not None}


@dataclass(frozen=True)
class Figures:
    """A part's ``/metrics`` source: its readings, and the HELP of each."""

    read: Callable[[], dict[str, float]]
    help: dict[str, str]

    def __call__(self) -> dict[str, float]:
        return self.read()
