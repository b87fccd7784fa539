"""The inner order of the two packages, checked on the import graph of
test_layering.py: a module imports only from its own layer or lower ones.

blockpool/: core (the vLLM pool and the shared helpers at the root) <
runtime | shadow | storage < analysis | kvevents | trace | mirror.
app/: base (the loose modules: engine, settings, errors, schemas, views, the
workloads) < analysis < api | stream | observer < mirror (the read-only
follower of a real engine: its routes sit on the api layer) < assembly (main, cli).

``KNOWN`` lists the imports that break the order today, each to go when its
module moves (docs/architecture.md); an entry that no longer occurs fails
too, so the list only shrinks."""

from __future__ import annotations

from tests.architecture.test_layering import GRAPH, MODULES

BLOCKPOOL_RANK = {
    "core": 0,
    "runtime": 1,
    "shadow": 1,
    "storage": 1,
    "analysis": 2,
    "kvevents": 2,
    "trace": 2,
    "mirror": 2,
}
APP_RANK = {
    "base": 0,
    "analysis": 1,
    "api": 2,
    "stream": 2,
    "observer": 2,
    "mirror": 3,
    "assembly": 4,
}
ASSEMBLY = {"app.main", "app.cli", "app.trace.cli", "app.web.assembly"}

KNOWN = {
    # the engine creates its analysis host; the collector reads the analysis' families
    ("app.pool.engine", "app.analysis.host"),
    ("app.pool.metrics", "app.analysis.prom"),
    # the stream's websocket uses the REST dependencies and response models
    ("app.stream.ws", "app.api.deps"),
    ("app.stream.ws", "app.api.responses"),
    ("app.stream.ws", "app.api.responses.stream"),
    # the observer app is assembled with the pool service's middleware
    ("app.observer.app", "app.web.assembly"),
}


def layer(mod: str) -> tuple[str, str]:
    """(package, layer) of a module."""
    parts = mod.split(".")
    package = parts[0]
    if mod in ASSEMBLY:
        return package, "assembly"
    is_package = MODULES[mod].name == "__init__.py"
    if len(parts) > 2 or (len(parts) == 2 and is_package):
        return package, parts[1]
    return package, "core" if package == "blockpool" else "base"


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
