"""The folders of ``blockpool/trace/`` in their order (docs/architecture.md):
the workload read, sizing, sequence replays, the scheduler simulation,
planning, fleets.  A module imports from its own folder or from one before
it, never from a later one."""

from __future__ import annotations

from tests.architecture.test_layering import GRAPH, MODULES

ORDER = ("workload", "sizing", "replay", "sched", "plan", "fleet")
PREFIX = "blockpool.trace."


def folder(mod: str) -> str | None:
    """The folder of a module under ``blockpool/trace/``; None for the
    package's ``__init__`` (it re-exports) and modules elsewhere."""
    if not mod.startswith(PREFIX):
        return None
    return mod[len(PREFIX) :].split(".")[0]


def test_every_module_sits_in_a_folder() -> None:
    loose = [m for m in MODULES if m.startswith(PREFIX) and folder(m) not in ORDER]
    assert loose == []


def test_every_folder_is_there() -> None:
    assert {folder(m) for m in MODULES if m.startswith(PREFIX)} == set(ORDER)


def test_imports_point_back_up_the_order() -> None:
    late = sorted(
        f"{mod} -> {target}"
        for mod, targets in GRAPH.items()
        for target in targets
        if (a := folder(mod)) and (b := folder(target)) and ORDER.index(b) > ORDER.index(a)
    )
    assert late == []
