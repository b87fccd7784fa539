"""One name per thing, checked on the source of the product code
(``blockpool/``, ``app/``, ``blockpool_vllm/``).

- no two classes share a name: a reader (or a grep) that meets ``Engine``
  must know which one it is;
- a module's basename is used in two packages at most; a third use keeps its
  name only when every module of that basename says why in its docstring,
  on a line that starts with ``Shared name:``.

``KNOWN_CLASSES`` and ``KNOWN_BASENAMES`` list what still breaks a rule, each
to go when its code is renamed; an entry that no longer occurs fails too, so
the lists only shrink.  ``KEPT_CLASSES`` (part of ``KNOWN_CLASSES``) are
pairs that keep their name for good, each with its reason: a response model's
class name is its OpenAPI component name (``/openapi.json``), which a client
generated from ``/docs`` relies on (tests/app/test_openapi_stable.py).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("blockpool", "app", "blockpool_vllm")
REASON = "Shared name:"

# (empty: the trace restructure renamed its side -- SimulatedEngineCore,
# ScrapedHistogram, DriverStats -- and the list only shrinks)
TRACE_RESTRUCTURE: set[str] = set()
# Both sides keep their name, with the reason.
OPENAPI_AND_WIRE = "OpenAPI component name; wire record in blockpool/mirror/protocol.py"
KEPT_CLASSES: dict[str, str] = {
    "Batch": OPENAPI_AND_WIRE,  # app/pool/views/operations.py
    "Finished": OPENAPI_AND_WIRE,  # blockpool/runtime/ops/finish.py
    "Reset": OPENAPI_AND_WIRE,  # blockpool/runtime/ops/reset.py
}
KNOWN_CLASSES: set[str] = TRACE_RESTRUCTURE | set(KEPT_CLASSES)
KNOWN_BASENAMES: set[str] = set()


def _files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def classes_by_name(files: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Every class definition (at any depth), by name: ``path:line``."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out[node.name].append(f"{path.relative_to(root)}:{node.lineno}")
    return dict(out)


def duplicate_classes(files: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    return {name: where for name, where in classes_by_name(files, root).items() if len(where) > 1}


def packages_by_basename(files: list[Path], root: Path = ROOT) -> dict[str, dict[str, Path]]:
    """basename -> {package: module}, ``__init__`` aside (a package's name is
    its folder's)."""
    out: dict[str, dict[str, Path]] = defaultdict(dict)
    for path in files:
        if path.name == "__init__.py":
            continue
        package = ".".join(path.relative_to(root).parent.parts)
        out[path.stem][package] = path
    return dict(out)


def _gives_a_reason(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    return any(line.strip().startswith(REASON) for line in doc.splitlines())


def crowded_basenames(files: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Basenames in more than two packages where a module does not say why."""
    return {
        name: sorted(by_package)
        for name, by_package in packages_by_basename(files, root).items()
        if len(by_package) > 2 and not all(_gives_a_reason(p) for p in by_package.values())
    }


def test_the_checks_see_a_twin_and_a_crowded_name(tmp_path: Path) -> None:
    files = []
    for rel, text in {
        "a/x.py": "class Engine: ...\n",
        "b/x.py": '"""Shared name: a reason."""\nclass Engine: ...\n',
        "c/x.py": "def f():\n    class Inner: ...\n",
        "d/y.py": "class Inner: ...\n",
    }.items():
        path = tmp_path / rel
        path.parent.mkdir()
        path.write_text(text)
        files.append(path)
    assert sorted(duplicate_classes(files, tmp_path)) == ["Engine", "Inner"]
    assert crowded_basenames(files, tmp_path) == {"x": ["a", "b", "c"]}
    assert crowded_basenames(files[1:], tmp_path) == {}  # two packages: fine


def test_no_two_classes_share_a_name() -> None:
    found = duplicate_classes(_files())
    unexpected = {n: w for n, w in found.items() if n not in KNOWN_CLASSES}
    assert unexpected == {}


def test_no_basename_is_used_in_more_than_two_packages() -> None:
    found = crowded_basenames(_files())
    unexpected = {n: p for n, p in found.items() if n not in KNOWN_BASENAMES}
    assert unexpected == {}


def test_the_known_exceptions_still_occur() -> None:
    files = _files()
    assert sorted(KNOWN_CLASSES - set(duplicate_classes(files))) == []
    assert sorted(KNOWN_BASENAMES - set(crowded_basenames(files))) == []
