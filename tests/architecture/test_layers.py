"""The inner order of the two packages, checked on the import graph of
test_layering.py: a module imports only from its own layer or lower ones.
Each folder is one layer; no module sits at a package's root but the
entry points.

blockpool/: common (leaf helpers: hash keys, histograms, the miss-reason
codes) < core (vLLM's pool and request manager) < runtime | shadow | storage
< analysis | kvevents | trace | mirror.  The package's ``__init__`` re-exports
the core.
app/: shared (settings, errors, auth, serving: shared by both apps) < web
(the HTTP assembly both apps are built from) < analysis | observer (the
observer stands apart: it sees only shared and web) < pool (the engine, its bodies,
views, workloads) < trace (the trace driver and command) < api < stream |
mirror (the websocket and the read-only mirror sit on the api's dependencies)
< assembly (main, cli and the modules of the cli package).

``KNOWN`` lists the imports that still break the order, each to go when its
module moves (docs/architecture.md); an entry that no longer occurs fails
too, so the list only shrinks."""

from __future__ import annotations

from tests.architecture.test_layering import GRAPH, MODULES

BLOCKPOOL_RANK = {
    "common": 0,
    "core": 1,
    "runtime": 2,
    "shadow": 2,
    "storage": 2,
    "analysis": 3,
    "kvevents": 3,
    "trace": 3,
    "mirror": 3,
}
APP_RANK = {
    "shared": 0,
    "web": 1,
    "analysis": 2,
    "observer": 2,
    "pool": 3,
    "trace": 4,
    "api": 5,
    "stream": 6,
    "mirror": 6,
    "assembly": 7,
}
ENTRY_POINTS = {"app", "app.main", "app.cli"}  # app: the command, which only defers to app.cli
ENTRY_PACKAGE = "app.cli."  # the command line's modules: entry points too

KNOWN: set[tuple[str, str]] = set()


def layer(mod: str) -> tuple[str, str]:
    """(package, layer) of a module: its folder below the package; the
    package itself re-exports (blockpool) or is empty (app): core."""
    parts = mod.split(".")
    package = parts[0]
    if mod in ENTRY_POINTS or mod.startswith(ENTRY_PACKAGE):
        return package, "assembly"
    if len(parts) == 1:
        return package, "core"
    if len(parts) == 2 and MODULES[mod].name != "__init__.py":
        return package, "root"  # a loose module: it has no layer
    return package, parts[1]


def rank(mod: str) -> int:
    package, name = layer(mod)
    ranks = BLOCKPOOL_RANK if package == "blockpool" else APP_RANK
    assert name in ranks, f"{mod}: layer {name!r} has no place in the order; add it"
    return ranks[name]


def breaks() -> set[tuple[str, str]]:
    """Imports of a module from a higher layer, or from a sibling layer."""
    out = set()
    for mod, targets in GRAPH.items():
        for target in targets:
            if layer(mod)[0] != layer(target)[0]:
                continue  # across packages: test_layering's rule
            same = layer(mod) == layer(target)
            if not same and rank(target) >= rank(mod):
                out.add((mod, target))
    return out


def test_every_module_has_a_layer() -> None:
    for mod in MODULES:
        rank(mod)


def test_imports_point_down_the_layers() -> None:
    unexpected = sorted(breaks() - KNOWN)
    assert unexpected == [], "imports up or sideways: " + ", ".join(
        f"{a} -> {b}" for a, b in unexpected
    )


def test_the_known_exceptions_still_occur() -> None:
    assert sorted(KNOWN - breaks()) == []


def test_every_layer_is_a_folder_of_the_tree() -> None:
    """No rank is kept for a layer that is gone."""
    seen = {layer(mod) for mod in MODULES}
    assert {("blockpool", n) for n in BLOCKPOOL_RANK} <= seen
    assert {("app", n) for n in APP_RANK} <= seen


def test_no_module_is_loose() -> None:
    assert layer("app.main") == ("app", "assembly")
    assert layer("app.cli.commands") == ("app", "assembly")
    assert layer("blockpool.core.pool") == ("blockpool", "core")
    assert layer("blockpool") == ("blockpool", "core")
    assert ("app", "root") not in {layer(mod) for mod in MODULES}
    assert ("blockpool", "root") not in {layer(mod) for mod in MODULES}
