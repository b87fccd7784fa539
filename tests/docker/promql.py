"""Enough PromQL to check a dashboard against a live app: the metric
selectors of an expression, what is wrong with a selector against scraped
series, and an evaluator for vLLM's KV-cache panel queries over two
scrapes."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.docker.helpers import MODEL, STREAM_METRICS, TARGET_LABELS

PROMQL_WORDS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio", "by", "without", "on",
    "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan", "atan2",
}  # fmt: skip
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
MATCHER = re.compile(rf"({NAME})\s*(=~|!~|!=|=)\s*({STRING})")


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)
    wrapped_by: str | None  # the function right around it: rate, histogram_quantile's arg...


def selectors(expr: str) -> list[Selector]:
    """The metric selectors of a PromQL expression (enough PromQL for dashboards)."""
    # Strings and label blocks first, so that nothing inside them reads as a name.
    blocks: list[str] = []

    def keep_block(m: re.Match[str]) -> str:
        blocks.append(m.group(0))
        return f"{{#{len(blocks) - 1}}}"

    text = re.sub(rf"\{{(?:{STRING}|[^{{}}\"'])*\}}", keep_block, expr)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(
        rf"\b(by|without|on|ignoring|group_left|group_right)\s*\(\s*(?:{NAME}\s*,?\s*)*\)",
        " ", text,
    )  # fmt: skip
    out: list[Selector] = []
    for m in re.finditer(rf"(?<![\w:$.#]){NAME}", text):
        word = m.group(0)
        after = text[m.end() :].lstrip()
        if after.startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or a keyword
        matchers: tuple[tuple[str, str, str], ...] = ()
        if after.startswith("{#"):
            block = blocks[int(after[2 : after.index("}")])]
            matchers = tuple(
                (lbl, op, json.loads(val) if val.startswith('"') else val[1:-1])
                for lbl, op, val in MATCHER.findall(block)
            )
        out.append(Selector(word, matchers, _enclosing_call(text[: m.start()])))
    # Bare label blocks ({__name__=~"..."}) are not used by the dashboard.
    assert not re.search(r"(?<![\w:])\{#", text), f"selector without a metric name: {expr}"
    return out


def _enclosing_call(before: str) -> str | None:
    """The function or aggregation whose parenthesis is still open at the end
    of ``before`` (None at the top level)."""
    depth = 0
    for i in range(len(before) - 1, -1, -1):
        c = before[i]
        if c == ")":
            depth += 1
        elif c == "(":
            if depth == 0:
                fn = re.search(rf"({NAME})\s*$", before[:i])
                return fn.group(1) if fn else None
            depth -= 1
    return None


@dataclass
class Scrape:
    at: float
    text: str
    summary: dict[str, Any]

    @property
    def families(self) -> list[Any]:
        return list(text_string_to_metric_families(self.text))

    def samples(self) -> list[tuple[str, dict[str, str], float, str]]:
        """(sample name, labels, value, family type)."""
        return [(s.name, s.labels, s.value, f.type) for f in self.families for s in f.samples]


@dataclass
class Live:
    first: Scrape
    last: Scrape


def live_names(scrape: Scrape) -> dict[str, str]:
    """Series name -> type of its family (what Prometheus would store)."""
    return {name: ftype for name, _, _, ftype in scrape.samples()}


def check_selector(sel: Selector, scrape: Scrape) -> list[str]:
    """What is wrong with one selector against the live series ([] when fine)."""
    names = live_names(scrape)
    if sel.name not in names:
        if sel.name in STREAM_METRICS and not any(n.startswith("blockpool_stream_") for n in names):
            return []  # the stream is not in /metrics yet: excused (see STREAM_METRICS)
        family_hint = ""
        for suffix in ("_bucket", "_sum", "_count", "_total"):
            if sel.name.endswith(suffix):
                family_hint = f" (family {sel.name.removesuffix(suffix)!r})"
        return [f"{sel.name}: no such series{family_hint}"]
    errors = []
    ftype = names[sel.name]
    role = next((s for s in ("_bucket", "_sum", "_count", "_total") if sel.name.endswith(s)), "")
    if role == "_bucket" and ftype != "histogram":
        errors.append(f"{sel.name}: _bucket of a {ftype}")
    if sel.wrapped_by in ("rate", "irate", "increase") and not (
        (ftype == "counter" and role == "_total") or (ftype == "histogram" and role)
    ):
        errors.append(f"{sel.name}: {sel.wrapped_by}() of a {ftype}, not a counter")
    if sel.wrapped_by == "histogram_quantile":
        errors.append(f"{sel.name}: histogram_quantile() needs rate() of _bucket series")
    # Some live series must satisfy every matcher on the app's own labels.
    wanted = [(lbl, op, val) for lbl, op, val in sel.matchers if lbl not in TARGET_LABELS]
    series = [labels for n, labels, _, _ in scrape.samples() if n == sel.name]
    if not any(all(_matches(labels, m) for m in wanted) for labels in series):
        errors.append(f"{sel.name}{{{wanted}}}: selects no live series")
    return errors


def _matches(labels: dict[str, str], matcher: tuple[str, str, str]) -> bool:
    lbl, op, val = matcher
    val = val.replace("$model_name", MODEL).replace("$pool", ".+")  # $pool: All
    have = labels.get(lbl, "")
    if op == "=":
        return have == val
    if op == "!=":
        return have != val
    hit = re.fullmatch(val, have) is not None
    return hit if op == "=~" else not hit


def _instant(scrape: Scrape, sel: Selector) -> dict[frozenset[tuple[str, str]], float]:
    """An instant vector: label set (without __name__) -> value."""
    out = {}
    for name, labels, value, _ in scrape.samples():
        if name == sel.name and all(_matches(labels, m) for m in sel.matchers):
            out[frozenset(labels.items())] = value
    return out


def evaluate(expr: str, live: Live) -> dict[frozenset[tuple[str, str]], float]:
    """Enough PromQL for vLLM's KV-cache panels: a selector, or
    rate(a[..]) / rate(b[..]) matched one-to-one on labels, over two scrapes."""
    sels = selectors(expr)
    if len(sels) == 1 and sels[0].wrapped_by is None:
        return _instant(live.last, sels[0])
    m = re.fullmatch(r"\s*rate\((.+?)\)\s*/\s*rate\((.+?)\)\s*", expr)
    assert m and len(sels) == 2, f"not supported here: {expr}"
    dt = live.last.at - live.first.at

    def rate(sel: Selector) -> dict[frozenset[tuple[str, str]], float]:
        a, b = _instant(live.first, sel), _instant(live.last, sel)
        return {k: (b[k] - a[k]) / dt for k in b if k in a}

    num, den = rate(sels[0]), rate(sels[1])
    return {k: num[k] / den[k] for k in num if den.get(k)}
