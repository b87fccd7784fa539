"""The frontend's layers (no browser): every module listed in frontend/README.md,
every relative import resolving to a file, imports pointing one way, and no
test hook (a ``window.__`` global) in a module the pages load."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JS = REPO / "frontend" / "js"
IMPORT = re.compile(r'^\s*(?:import|export)\b[^"\']*?from\s+["\']([^"\']+)["\']', re.M)
DYNAMIC = re.compile(r'\bimport\(\s*["\']([^"\']+)["\']')

# rank of a layer: a module may import its own layer or a lower one
DASHBOARD_RANK = {"wire": 1, "state": 2, "render": 3, "panels": 4}


def code(path: Path) -> str:
    """The module without its comments."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return re.sub(r"^\s*//.*$", "", text, flags=re.M)


def modules() -> list[Path]:
    return sorted(JS.rglob("*.js"))


def layer(path: Path) -> tuple[str, int]:
    parts = path.relative_to(JS).parts
    if parts[0] == "common":
        return "common", 0
    if parts[0] == "fleet":
        return "fleet", 1
    assert parts[0] == "dashboard", f"{path}: a module outside common/, dashboard/, fleet/"
    if len(parts) == 2:  # main.js, testhooks.js
        return "dashboard", 5
    return "dashboard", DASHBOARD_RANK[parts[1]]


def imports(path: Path) -> list[Path]:
    text = code(path)
    specs = IMPORT.findall(text) + DYNAMIC.findall(text)
    out = []
    for spec in specs:
        assert spec.startswith("."), f"{path.name}: a bare import {spec!r} (no build step, no npm)"
        out.append((path.parent / spec).resolve())
    return out


def test_every_module_is_listed_in_the_readme() -> None:
    readme = (REPO / "frontend" / "README.md").read_text()
    listed = set(re.findall(r"^- `([\w/]+\.js)`", readme, re.M))
    found = {str(p.relative_to(JS)) for p in modules()}
    # the dashboard's modules are listed without their "dashboard/" prefix
    found = {f[len("dashboard/") :] if f.startswith("dashboard/") else f for f in found}
    assert found - listed == set(), "modules missing from frontend/README.md"
    assert listed - found == set(), "frontend/README.md lists modules that do not exist"


def test_imports_resolve_and_point_one_way() -> None:
    wrong = []
    for mod in modules():
        side, rank = layer(mod)
        for target in imports(mod):
            assert target.exists(), f"{mod.relative_to(JS)} imports a missing {target}"
            t_side, t_rank = layer(target)
            ok = t_side == "common" or (t_side == side and t_rank <= rank)
            if not ok:
                wrong.append(f"{mod.relative_to(JS)} -> {target.relative_to(JS)}")
    assert wrong == []


def test_only_the_test_hooks_set_window_globals() -> None:
    hooks = JS / "dashboard" / "testhooks.js"
    offenders = [str(p.relative_to(JS)) for p in modules() if p != hooks and "window.__" in code(p)]
    assert offenders == []
    assert "window.__bp" in hooks.read_text()
    # and no page loads the hooks module (tests/e2e/hooks.py injects it)
    for page in ("index.html", "fleet.html"):
        assert "testhooks" not in (REPO / "frontend" / page).read_text()
    assert not any("testhooks" in str(t) for p in modules() if p != hooks for t in imports(p))
