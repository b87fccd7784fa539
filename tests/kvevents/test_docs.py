"""docs/observer.md names every route and metric the observer has, and no other."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app.observer.app import create_observer_app
from app.observer.metrics import ObserverCollector
from app.shared.settings import ObserverSettings

DOC = (Path(__file__).resolve().parents[2] / "docs" / "observer.md").read_text()


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    app = create_observer_app(ObserverSettings(endpoints=["tcp://127.0.0.1:1"]))
    routes = {
        (method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops
    }
    routes.add(("GET", "/metrics"))
    rest = DOC[DOC.index("## REST API") : DOC.index("## Live websocket")]
    documented = set(re.findall(r"`(GET|POST) (/[^`?\s]*)", rest))
    assert documented == routes
    assert "/api/fleet/stream" in DOC


def test_every_metric_is_documented() -> None:
    app = create_observer_app(ObserverSettings(endpoints=["tcp://127.0.0.1:1"]))
    names = {m.name for m in ObserverCollector(app.state.fleet, app.state.hub).collect()}
    prefix = "blockpool_observer"
    for name in names:
        short = name.removeprefix(prefix)
        counter = f"`{short}_total`" in DOC or f"`{name}_total`" in DOC
        assert f"`{short}`" in DOC or f"`{name}`" in DOC or counter, name


def test_cli_flags_in_the_doc_exist() -> None:
    from app.cli import parser

    text = parser().format_help()
    sub = parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    flags = set()
    for name in ("serve", "observe"):
        for action in sub[name]._actions:
            flags.update(action.option_strings)
    for flag in re.findall(r"`(--[a-z-]+)", DOC):
        # vLLM's own flag and the bench script's are not ours
        assert flag in flags or flag in ("--prefix-caching-hash-algo", "--vllm-python"), flag
    assert text


def test_the_documented_alerts_match_the_metrics() -> None:
    """The alert rules in docs/observer.md name metrics the observer has, by
    the label they carry (pool -- never instance, which Prometheus renames)."""
    import yaml

    from tests.docker.promql import selectors

    block = re.search(r"```yaml\n(groups:.*?)```", DOC, re.S)
    assert block, "docs/observer.md has no alert rules"
    rules = [r for g in yaml.safe_load(block[1])["groups"] for r in g["rules"]]
    assert len(rules) >= 2
    app = create_observer_app(ObserverSettings(endpoints=["p=tcp://127.0.0.1:1"]))
    families = {m.name: m for m in ObserverCollector(app.state.fleet, app.state.hub).collect()}
    for rule in rules:
        (sel,) = selectors(rule["expr"])
        family = families.get(sel.name)
        assert family is not None, sel.name
        labels = {k for s in family.samples for k in s.labels}
        assert labels == {"pool"}, (sel.name, labels)
        used = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"])))
        assert used and used <= labels, rule["alert"]
