"""How the parts are wired, checked on the source: declared hooks, one owner.

- the runtime's state (its references, prefix tree, columns, counters, the
  caps in force) is written by ``blockpool/runtime`` only: a jump of the pool
  is ``PoolRuntime.restore``, not fields written from outside (``full_dirty``
  is the tick's to take and clear);
- the runtime's observers are told by the runtime only (its ``observers``
  not read from outside -- ``PoolRuntime.observe`` adds one --, no
  ``getattr`` of an observer method: ``OpObserver`` declares them all);
- the wiring of the mirror goes through declared calls
  (``EngineMisses.observing``, ``AnalysisHost.show_engine_misses``,
  ``StreamHub.follow_mirror``): nothing sets ``engine_misses``,
  ``mirror_header`` or ``on_drop`` on another object.
"""

from __future__ import annotations

import ast
from pathlib import Path

from blockpool.runtime.observer import OpObserver
from tests.architecture.test_layering import ROOT, TREES

RUNTIME_STATE = {
    "raw_refs",
    "tree",
    "columns",
    "counters",
    "caps",
    "tail_waste",
    "request_counter",
    "pool",
    "manager",
}
INJECTED = {"engine_misses", "mirror_header", "on_drop"}
OBSERVER_METHODS = {n for n in vars(OpObserver) if n.startswith("on_")}
EXTRA = {"frontend.tests.make_fixtures": ROOT / "frontend" / "tests" / "make_fixtures.py"}


def _trees() -> dict[str, ast.AST]:
    trees: dict[str, ast.AST] = dict(TREES)
    for name, path in EXTRA.items():
        trees[name] = ast.parse(path.read_text(), str(path))
    return trees


def _not_self(node: ast.Attribute) -> bool:
    return not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))


def stored_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every ``x.name = / x.name[...] = / x.name += ...``
    where ``x`` is not ``self``."""
    out = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        while targets:
            t = targets.pop(0)
            if isinstance(t, ast.Tuple | ast.List):
                targets.extend(t.elts)
                continue
            if isinstance(t, ast.Subscript):
                t = t.value  # x.name[i] = ... writes x.name
            if isinstance(t, ast.Attribute) and _not_self(t):
                out.append((t.lineno, t.attr))
    return out


def test_the_checks_see_a_write_and_a_hook_call() -> None:
    sample = ast.parse(
        "rt.raw_refs[:] = 0\nrt.tree = t\nself.tree = t\nfor o in rt.observers:\n"
        "    o.on_resync()\nself.observers = ()\nrt.observers[0].on_reset()\n"
    )
    assert stored_attributes(sample) == [(1, "raw_refs"), (2, "tree")]
    assert hook_calls(sample) == ["4: .observers", "7: .observers"]
    assert {"on_allocate", "on_reset", "on_resync"} <= OBSERVER_METHODS


def test_only_the_runtime_writes_its_state() -> None:
    bad = {
        mod: [f"{line}: .{name}" for line, name in stored_attributes(tree) if name in RUNTIME_STATE]
        for mod, tree in _trees().items()
        if not mod.startswith("blockpool.runtime")
    }
    assert {m: b for m, b in bad.items() if b} == {}


def hook_calls(tree: ast.AST) -> list[str]:
    """Calls of an observer from outside: the runtime's observers read
    (``x.observers``), ``x.mark_all_dirty()``, ``getattr(x, "on_...")``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "observers" and _not_self(node):
            out.append(f"{node.lineno}: .observers")
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute):
            if f.attr == "mark_all_dirty" and _not_self(f):
                out.append(f"{node.lineno}: .mark_all_dirty")
        elif isinstance(f, ast.Name) and f.id in ("getattr", "hasattr", "setattr"):
            name = node.args[1] if len(node.args) >= 2 else None
            if isinstance(name, ast.Constant) and name.value in OBSERVER_METHODS | INJECTED:
                out.append(f"{node.lineno}: {f.id} {name.value}")
    return out


def test_the_observer_is_told_by_the_runtime_only() -> None:
    bad = {
        mod: hook_calls(tree)
        for mod, tree in _trees().items()
        if not mod.startswith("blockpool.runtime")
    }
    assert {m: b for m, b in bad.items() if b} == {}


def test_no_attribute_is_injected_into_another_object() -> None:
    bad = {
        mod: [f"{line}: .{name}" for line, name in stored_attributes(tree) if name in INJECTED]
        for mod, tree in _trees().items()
    }
    assert {m: b for m, b in bad.items() if b} == {}


def test_the_extra_files_exist() -> None:
    assert all(Path(p).is_file() for p in EXTRA.values())
