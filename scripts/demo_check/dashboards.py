"""Every query of every Grafana dashboard shipped under docker/grafana, with
its template variables resolved as Grafana resolves them against a
Prometheus datasource: query variables from the label values Prometheus
holds (``label_values``), "All" / multi-value as a regex ``(a|b)``,
custom and constant ones from their options, and Grafana's built-in
intervals.  Dashboards are found generically (any JSON with panels)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Grafana's built-ins, as it sets them for a dashboard over the last 5
# minutes with a 5 s scrape interval ($__rate_interval: at least four
# scrapes, rounded up to a minute so that every window holds several).
BUILTINS = {
    "__rate_interval": "1m",
    "__rate_interval_ms": "60000",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}
# $var, ${var}, ${var:format}, [[var]]
VAR_REF = re.compile(r"\$([A-Za-z_]\w*)|\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)(?::(\w+))?\]\]")
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.*),\s*)?([a-zA-Z_]\w*)\s*\)\s*$", re.DOTALL)
# Grafana's prometheusSpecialRegexEscape: written into a PromQL string, so
# each escape is itself escaped ("a.b" -> "a\\\\.b", the regex a\\.b).
REGEX_SPECIAL = re.compile(r"([$^*{}\[\]'+?.()|])")

# Series only a compose profile's services export: a query that selects one
# is checked when that profile runs (``serve --mirror`` needs a real engine).
PROFILE_METRICS = {"vllm": ("blockpool_mirror_",)}

# (label, match[] selector or None) -> the label's values Prometheus holds
LabelValues = Callable[[str, str | None], list[str]]


@dataclass(frozen=True)
class Query:
    dashboard: str  # the file, relative to docker/grafana
    panel: str
    ref: str
    expr: str


def dashboard_files(root: Path) -> list[Path]:
    """The JSON files under ``root`` that are dashboards (they have panels)."""
    out = []
    for path in sorted(root.rglob("*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and isinstance(doc.get("panels"), list):
            out.append(path)
    return out


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])  # a collapsed row holds its panels


def _is_prometheus(ds: Any) -> bool:
    """A target's (or panel's) datasource: Prometheus, or not given (the
    dashboard's default, Prometheus here); mixed / expressions are not."""
    if ds is None or isinstance(ds, str):
        return ds is None or not ds.startswith("-- ")
    return ds.get("type") in (None, "prometheus")


def queries(path: Path, root: Path) -> list[Query]:
    doc = json.loads(path.read_text())
    out = []
    for panel in _panels(doc["panels"]):
        for t in panel.get("targets") or []:
            expr = t.get("expr")
            if not expr or not _is_prometheus(t.get("datasource", panel.get("datasource"))):
                continue
            title = panel.get("title") or f"panel {panel.get('id')}"
            out.append(Query(str(path.relative_to(root)), title, t.get("refId", "?"), expr))
    return out


def _format(values: list[str], multi: bool, fmt: str | None) -> str:
    """A variable's values as Grafana's Prometheus datasource writes them
    into a query."""
    if fmt == "raw":
        return ",".join(values)
    if fmt == "regex" or multi:
        escaped = [REGEX_SPECIAL.sub(r"\\\\\1", v.replace("\\", "\\" * 4)) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    # prometheusRegularEscape
    return values[0].replace("\\", "\\\\").replace("'", "\\\\'") if values else ""


class Variables:
    """A dashboard's template variables, resolved in their order (a later
    one may use an earlier one), against ``label_values``."""

    def __init__(self, doc: dict[str, Any], label_values: LabelValues) -> None:
        self.values: dict[str, tuple[list[str], bool]] = {}  # name -> (values, multi)
        self.literal: dict[str, str] = {}  # an "All" with a custom allValue
        self.problems: list[str] = []
        for var in (doc.get("templating") or {}).get("list") or []:
            self._resolve(var, label_values)

    def _resolve(self, var: dict[str, Any], label_values: LabelValues) -> None:
        name, kind = var["name"], var.get("type", "query")
        multi = bool(var.get("multi") or var.get("includeAll"))
        values: list[str]
        if kind == "query":
            q = var.get("query")
            text = q.get("query", "") if isinstance(q, dict) else str(q or "")
            m = LABEL_VALUES.match(self.substitute(text))
            if not m:
                self.problems.append(f"${name}: query {text!r} is not label_values(...)")
                return
            values = label_values(m.group(2), m.group(1))
            if var.get("regex"):
                rx = re.compile(var["regex"].strip("/"))
                values = [v for v in values if rx.search(v)]
            if not values:
                self.problems.append(f"${name}: {text} has no values in Prometheus")
                return
        elif kind in ("custom", "constant", "textbox", "interval"):
            options = [o["value"] for o in var.get("options") or [] if o.get("value") != "$__all"]
            current = (var.get("current") or {}).get("value")
            if isinstance(current, list):
                values = [v for v in current if v != "$__all"] or options
            elif current and current != "$__all":
                values = [str(current)]
            else:
                values = options or [str(var.get("query", ""))]
        else:  # datasource, adhoc: nothing to put into an expression
            return
        current = (var.get("current") or {}).get("value")
        chose_all = current == "$__all" or (isinstance(current, list) and "$__all" in current)
        if var.get("includeAll") and chose_all and var.get("allValue"):
            self.literal[name] = var["allValue"]
        self.values[name] = (values, multi)

    def substitute(self, expr: str) -> str:
        def one(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2) or m.group(4)
            fmt = m.group(3) or m.group(5)
            if name in BUILTINS:
                return BUILTINS[name]
            if name in self.literal:
                return self.literal[name]
            if name in self.values:
                values, multi = self.values[name]
                return _format(values, multi, fmt)
            return m.group(0)

        return VAR_REF.sub(one, expr)


def needs_profile(expr: str) -> str | None:
    """The profile whose services export what ``expr`` selects, if any."""
    for profile, prefixes in PROFILE_METRICS.items():
        if any(p in expr for p in prefixes):
            return profile
    return None


def unresolved(expr: str) -> list[str]:
    """Variable references left in an expression after substitution."""
    return [m.group(0) for m in VAR_REF.finditer(expr)]
