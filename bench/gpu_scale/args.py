"""Command-line values the GPU-scale benches check before they run: a
duration or rate below 0 would make the forward passes shorter than asked
(or a sleep of nothing) without a word."""

from __future__ import annotations

import argparse
import math


def non_negative(text: str) -> float:
    """A float of 0 or more (``argparse`` type)."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of 0 or more, not {text!r}")
    return value


def positive(text: str) -> float:
    """A float above 0 (``argparse`` type)."""
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text!r}")
    return value


def positive_int(text: str) -> int:
    """An int above 0 (``argparse`` type): a count of blocks, steps, rounds."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text!r}")
    return value


def add_forward_options(p: argparse.ArgumentParser) -> None:
    """``--forward-us-per-token`` (both GPU-scale benches' passes)."""
    p.add_argument(
        "--forward-us-per-token",
        type=non_negative,
        default=0.0,
        help="each forward pass longer by this for every token it runs (a GPU's "
        "prefill-heavy steps take longer than its decodes; 0: every pass --sleep-ms)",
    )
