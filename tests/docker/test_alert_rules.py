"""The alert rules shipped for Prometheus (docker/prometheus/rules): valid
for promtool, loaded by the compose stack's Prometheus, each with a ``for``,
a severity and annotations naming the page view to open, and their unit
tests (blockpool.rules.test.yml: every alert seen firing and seen quiet) pass
under ``promtool test rules`` -- and fail once a threshold is changed.

promtool comes from Debian's ``prometheus`` package; without it these tests
fail (tests/docker/prometheus_bin.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.docker.helpers import DOCKER, PROMETHEUS_YML
from tests.docker.prometheus_bin import promtool

RULES_DIR = DOCKER / "prometheus" / "rules"
RULES = RULES_DIR / "blockpool.rules.yml"
RULE_TESTS = RULES_DIR / "blockpool.rules.test.yml"
ALERTS = {
    "BlockpoolEvictedMissShareHigh",
    "BlockpoolEvictionRegretRateHigh",
    "BlockpoolMirrorNotExact",
    "BlockpoolMirrorBehind",
    "BlockpoolMirrorEngineSilent",
    "BlockpoolPluginStepCostHigh",
    "BlockpoolObserverStale",
    "BlockpoolObserverInexact",
}


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [r for g in data["groups"] for r in g["rules"]]


def test_promtool_checks_the_rules() -> None:
    proc = promtool("check", "rules", RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout


def test_every_alert_has_for_severity_and_names_a_view() -> None:
    got = rules()
    assert {r["alert"] for r in got} == ALERTS
    for r in got:
        name = r["alert"]
        assert re.fullmatch(r"\d+[sm]", r["for"]), name
        assert r["labels"]["severity"] in {"warning", "critical"}, name
        ann = r["annotations"]
        assert ann["summary"].strip() and ann["description"].strip(), name
        # the view to open: the blockpool page (with its time travel) or the observer's page
        desc = ann["description"]
        assert re.search(r"blockpool page's (\"[^\"]+\"|mirror item)", desc) or (
            "observer's fleet page (/?instance={{ $labels.pool }})" in desc
        ), name
        if "blockpool page" in desc and "Plugin" not in name:
            assert "time travel at the alert's start (/?at=<time>)" in desc, name


def test_the_compose_prometheus_loads_the_rules(compose: dict[str, Any]) -> None:
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    (pattern,) = cfg["rule_files"]
    mounts = {
        v["target"]: Path(v["source"])
        for v in compose["services"]["prometheus"]["volumes"]
        if v["type"] == "bind"
    }
    target = str(Path(pattern).parent)
    assert mounts[target].resolve() == RULES_DIR.resolve()
    loaded = sorted(RULES_DIR.glob(Path(pattern).name))
    assert loaded == [RULES]  # the unit tests' file is not loaded as rules
    assert all(
        v.get("read_only") for v in compose["services"]["prometheus"]["volumes"]
        if v["type"] == "bind"
    )  # fmt: skip


def test_the_config_with_its_rules_is_valid(tmp_path: Path) -> None:
    """promtool check config: prometheus.yml with rule_files pointed at a copy."""
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    shutil.copytree(RULES_DIR, tmp_path / "rules")
    cfg["rule_files"] = [str(tmp_path / "rules" / Path(cfg["rule_files"][0]).name)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    proc = promtool("check", "config", tmp_path / "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout


def test_rule_unit_tests_pass_and_cover_every_alert() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for t in case["alert_rule_test"]:
            (fired if t["exp_alerts"] else quiet).add(t["alertname"])
    assert fired == ALERTS, ALERTS - fired
    assert quiet == ALERTS, ALERTS - quiet
    proc = promtool("test", "rules", RULE_TESTS.name, cwd=RULES_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_rule_unit_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """The unit tests can fail: a looser evicted-miss share (50 % instead of
    20 %) no longer fires where they expect it."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text()
    assert text.count(") > 0.2\n") == 1
    (tmp_path / RULES.name).write_text(text.replace(") > 0.2\n", ") > 0.5\n"))
    proc = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert proc.returncode != 0
    assert "BlockpoolEvictedMissShareHigh" in proc.stdout + proc.stderr
