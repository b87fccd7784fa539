"""tests/support's waits: the value once the condition holds, and an error
naming what was awaited when it never does."""

from __future__ import annotations

import asyncio
import itertools
import sys

import pytest

from tests.support.cli import run_tool
from tests.support.ports import free_port
from tests.support.wait import eventually, eventually_async


def test_eventually_returns_the_first_truthy_value() -> None:
    calls = itertools.count(1)
    assert eventually(lambda: (n := next(calls)) >= 3 and n, 60, "three calls") == 3


def test_eventually_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the moon \(last: 0\)"):
        eventually(lambda: 0, 0.05, "the moon")


def test_eventually_async_takes_plain_and_async_predicates() -> None:
    calls = itertools.count(1)

    async def later() -> int:
        n = next(calls)
        return n if n >= 2 else 0

    async def both() -> tuple[int, bool]:
        return await eventually_async(later, 60, "two calls"), await eventually_async(
            lambda: True, 60, "at once"
        )

    assert asyncio.run(both()) == (2, True)
    with pytest.raises(AssertionError, match="waiting for nothing"):
        asyncio.run(eventually_async(lambda: None, 0.05, "nothing"))


def test_free_port_is_a_local_port() -> None:
    assert 0 < free_port() < 65536


def test_run_tool_gives_the_output_or_fails_with_its_tail() -> None:
    out = run_tool(
        [sys.executable, "-c", "import sys; print('to out'); print('to err', file=sys.stderr)"],
        timeout=60,
    )
    assert out == "to out\nto err\n"
    with pytest.raises(AssertionError, match=r"exited 3:\n.*the reason"):
        run_tool([sys.executable, "-c", "import sys; print('the reason'); sys.exit(3)"], timeout=60)
