"""The layering rule (docs/architecture.md), checked on the source itself.

- no import cycle among the modules of ``blockpool/`` and ``app/`` (every
  import counts: module level, inside functions, under TYPE_CHECKING);
- ``blockpool`` never imports ``app``, reads no environment, never awaits;
- nothing in ``app/`` touches a private attribute that ``blockpool/`` defines,
  or imports a private name from it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("blockpool", "app")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _resolve(name: str) -> str | None:
    """The longest known module that ``name`` starts with."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(mod: str) -> set[str]:
    """Every project module ``mod`` imports, wherever the import statement is."""
    path = MODULES[mod]
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(TREES[mod]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target:
                    out.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                full = ".".join([*base, node.module] if node.module else base)
            else:
                full = node.module or ""
            for alias in node.names:
                target = _resolve(f"{full}.{alias.name}") or _resolve(full)
                if target:
                    out.add(target)
    out.discard(mod)
    return out


GRAPH = {mod: imports_of(mod) for mod in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_cycle_and_the_real_graph() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # the checker reads real imports: the engine is built on the library's runtime
    assert "blockpool.runtime" in GRAPH["app.pool.engine"]
    assert "blockpool.core.pool" in GRAPH["blockpool.runtime.runtime"]


def test_no_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_the_library_never_imports_the_service() -> None:
    bad = {
        mod: sorted(t for t in targets if t == "app" or t.startswith("app."))
        for mod, targets in GRAPH.items()
        if mod.startswith("blockpool")
    }
    assert {m: t for m, t in bad.items() if t} == {}


def test_the_library_reads_no_environment_and_never_awaits() -> None:
    problems = []
    for mod, tree in TREES.items():
        if not mod.startswith("blockpool"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith):
                problems.append(f"{mod}:{node.lineno}: async")
            elif isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                problems.append(f"{mod}: os.{node.attr}")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names]
                module = getattr(node, "module", None) or ""
                if "asyncio" in names or module == "asyncio":
                    problems.append(f"{mod}:{node.lineno}: imports asyncio")
    # the one exception, as vLLM: init_none_hash(hash_fn) without a seed takes
    # PYTHONHASHSEED (the service always passes its seed)
    assert problems == ["blockpool.core.hashing: os.environ"]


def private_attributes_of_the_library() -> set[str]:
    """``_name`` attributes and methods that blockpool's classes define."""
    names: set[str] = set()
    for mod, tree in TREES.items():
        if not mod.startswith("blockpool"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in ast.walk(node):
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(item.name)
                    elif (
                        isinstance(item, ast.Attribute)
                        and isinstance(item.value, ast.Name)
                        and item.value.id == "self"
                        and isinstance(item.ctx, ast.Store)
                    ):
                        names.add(item.attr)
                    elif isinstance(item, ast.Constant) and isinstance(item.value, str):
                        names.add(item.value)  # __slots__ entries
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(tree: ast.AST, private: set[str]) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in private
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            out.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("blockpool"):
            out.extend(
                f"{node.lineno}: imports {a.name}" for a in node.names if a.name.startswith("_")
            )
    return sorted(out, key=lambda s: int(s.split(":")[0]))


def test_the_private_check_catches_a_private_read() -> None:
    private = private_attributes_of_the_library()
    assert {"_block_hash", "_cache", "_finished", "_hasher"} <= private
    sample = ast.parse("k = block._block_hash\nself._cache = {}\nfrom blockpool.x import _y\n")
    assert private_uses(sample, private) == ["1: ._block_hash", "3: imports _y"]


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if m.startswith("app")))
def test_the_service_touches_no_private_attribute_of_the_library(mod: str) -> None:
    private = private_attributes_of_the_library()
    # the service's own classes may use the same private names on themselves
    own: set[str] = set()
    for node in ast.walk(TREES[mod]):
        if isinstance(node, ast.ClassDef):
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef):
                    own.add(item.name)
                elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                    own.add(item.attr)
    assert private_uses(TREES[mod], private - own) == []
