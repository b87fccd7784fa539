"""make demo-check's reading of the Grafana dashboards
(scripts/demo_check/dashboards.py): every dashboard file found, every
Prometheus query of every panel (rows' panels too), and template variables
resolved as Grafana resolves them -- label_values against what Prometheus
holds (in order: a later variable uses an earlier one), "All" and multi
values as a regex, custom / constant from their options, the built-in
intervals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scripts.demo_check import dashboards
from tests.docker.helpers import DOCKER

LABELS = {
    ("job", "blockpool_free_blocks"): ["blockpool", "blockpool-gpu"],
    ("model_name", 'vllm:cache_config_info{job=~"(blockpool|blockpool-gpu)"}'): ["m.1"],
    ("pool", "blockpool_observer_connected"): ["app"],
}


def fake_label_values(label: str, match: str | None) -> list[str]:
    return LABELS.get((label, match or ""), [])


def var(name: str, query: str, **extra: object) -> dict[str, object]:
    return {"name": name, "type": "query", "query": {"query": query}, "multi": True,
            "includeAll": True, "current": {"value": ["$__all"]}, **extra}  # fmt: skip


def test_query_variables_resolve_in_order_as_grafana_writes_them() -> None:
    doc = {"templating": {"list": [
        var("job", "label_values(blockpool_free_blocks, job)"),
        var("model_name", 'label_values(vllm:cache_config_info{job=~"$job"}, model_name)'),
        var("pool", "label_values(blockpool_observer_connected, pool)", includeAll=False,
            multi=False),
        {"name": "q", "type": "custom", "current": {"value": "0.99"},
         "options": [{"value": "0.5"}, {"value": "0.99"}]},
        {"name": "env", "type": "constant", "query": "prod"},
    ]}}  # fmt: skip
    v = dashboards.Variables(doc, fake_label_values)
    assert v.problems == []
    expr = (
        'sum(rate(x{job=~"$job", model_name=~"${model_name}", pool="[[pool]]"}[$__rate_interval]))'
        ' * histogram_quantile($q, y{env="$env"}) + label_replace(z, "a", "$1", "b", "(.*)")'
    )
    out = v.substitute(expr)
    assert out == (
        'sum(rate(x{job=~"(blockpool|blockpool-gpu)", model_name=~"m\\\\.1", pool="app"}[1m]))'
        ' * histogram_quantile(0.99, y{env="prod"}) + label_replace(z, "a", "$1", "b", "(.*)")'
    )
    assert dashboards.unresolved(out) == []
    assert dashboards.unresolved('up{job="$nope"}') == ["$nope"]


def test_all_with_a_custom_all_value_and_the_variable_regex() -> None:
    doc = {"templating": {"list": [
        var("job", "label_values(blockpool_free_blocks, job)", allValue=".*"),
        var("gpu", "label_values(blockpool_free_blocks, job)", regex="/-gpu$/"),
    ]}}  # fmt: skip
    v = dashboards.Variables(doc, fake_label_values)
    assert v.substitute('a{job=~"$job"} b{job=~"$gpu"}') == ('a{job=~".*"} b{job=~"blockpool-gpu"}')


def test_a_variable_without_values_or_of_an_unknown_query_is_a_problem() -> None:
    doc = {"templating": {"list": [
        var("pool", "label_values(blockpool_missing, pool)"),
        var("odd", "query_result(up)"),
    ]}}  # fmt: skip
    v = dashboards.Variables(doc, fake_label_values)
    assert v.problems == [
        "$pool: label_values(blockpool_missing, pool) has no values in Prometheus",
        "$odd: query 'query_result(up)' is not label_values(...)",
    ]


def test_every_shipped_dashboard_and_panel_query_is_found(tmp_path: Path) -> None:
    root = DOCKER / "grafana"
    files = dashboards.dashboard_files(root)
    assert DOCKER / "grafana" / "dashboards" / "blockpool.json" in files
    for path in files:
        doc = json.loads(path.read_text())
        found = dashboards.queries(path, root)
        want = sum(
            1 for p in _all_panels(doc["panels"]) for t in p.get("targets") or [] if t.get("expr")
        )
        assert len(found) == want > 0, path
    # a row's collapsed panels count, a non-Prometheus target does not, and a
    # JSON that is not a dashboard (provisioning, anything else) is skipped
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "board.json").write_text(json.dumps({"panels": [
        {"type": "row", "panels": [{"title": "in row", "targets": [{"expr": "up", "refId": "A"}]}]},
        {"title": "expr", "targets": [{"expr": "1", "datasource": {"type": "__expr__"}}]},
        {"title": "top", "targets": [{"expr": "vllm:x", "refId": "B"}]},
    ]}))  # fmt: skip
    (tmp_path / "other.json").write_text(json.dumps({"apiVersion": 1}))
    assert dashboards.dashboard_files(tmp_path) == [tmp_path / "d" / "board.json"]
    assert dashboards.queries(tmp_path / "d" / "board.json", tmp_path) == [
        dashboards.Query("d/board.json", "in row", "A", "up"),
        dashboards.Query("d/board.json", "top", "B", "vllm:x"),
    ]


def _all_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in panels:
        out.append(p)
        out += _all_panels(p.get("panels") or [])
    return out


@pytest.mark.parametrize(
    ("values", "multi", "fmt", "want"),
    [
        (["a.b"], False, None, "a.b"),
        # a PromQL string holding the regex a\.b (Grafana's escaping)
        (["a.b"], True, None, "a\\\\.b"),
        (["x'y\\z"], False, None, "x\\\\'y\\\\z"),
        (["a", "b"], True, None, "(a|b)"),
        (["a", "b"], True, "raw", "a,b"),
    ],
)
def test_value_formats(values: list[str], multi: bool, fmt: str | None, want: str) -> None:
    doc = {"templating": {"list": [
        {"name": "v", "type": "custom", "multi": multi, "options": [{"value": x} for x in values],
         "current": {"value": values if multi else values[0]}},
    ]}}  # fmt: skip
    ref = "${v:raw}" if fmt == "raw" else "$v"
    assert dashboards.Variables(doc, fake_label_values).substitute(ref) == want


def test_queries_of_series_only_a_profile_exports_wait_for_that_profile() -> None:
    assert dashboards.needs_profile('max(blockpool_mirror_exact{job=~"$job"})') == "vllm"
    assert dashboards.needs_profile("rate(blockpool_evictions_total[1m])") is None
    assert dashboards.needs_profile("vllm:kv_cache_usage_perc") is None  # the app exports it
