"""The running stack probed as an operator would: the app's page, API and
docs, the observer, the load generator's own figures, Prometheus's targets
and its answers to every dashboard query.  Each probe waits on its
condition (never a fixed sleep) up to a deadline and says what it saw."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.demo_check import dashboards
from scripts.demo_check.phases import say

TIMEOUT_S = 30.0  # per request: the machine is shared
MAX_BODY = 16 * 1024 * 1024


class CheckFailed(Exception):
    pass


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            return r.status, r.read(MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(MAX_BODY).decode("utf-8", "replace")


def wait_for(what: str, probe: Callable[[], str | None], deadline_s: float) -> None:
    """Calls ``probe`` until it returns None (done) or the deadline passes;
    its last answer is the reason given."""
    end = time.monotonic() + deadline_s
    why: str | None = "not tried"
    while True:
        try:
            why = probe()
        except (OSError, ValueError, KeyError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if why is None:
            say(f"ok: {what}")
            return
        if time.monotonic() > end:
            raise CheckFailed(f"{what}: {why}")
        time.sleep(2)


@dataclass
class Stack:
    app: str  # http://127.0.0.1:PORT
    observer: str
    prometheus: str

    # ------------------------------------------------------------ the app
    def check_app(self) -> None:
        def health() -> str | None:
            code, body = get(self.app + "/api/health")
            ok = code == 200 and json.loads(body).get("status") == "ok"
            return None if ok else f"{code} {body[:200]}"

        def page() -> str | None:
            code, body = get(self.app + "/")
            ok = code == 200 and "<html" in body.lower() and "blockpool" in body.lower()
            return None if ok else f"{code} {body[:200]}"

        def docs() -> str | None:
            code, body = get(self.app + "/docs")
            ok = code == 200 and "swagger" in body.lower()
            code2, spec = get(self.app + "/openapi.json")
            ok = ok and code2 == 200 and "/api/health" in json.loads(spec).get("paths", {})
            return None if ok else f"/docs {code}, /openapi.json {code2}"

        wait_for("app /api/health", health, 60)
        wait_for("app dashboard page /", page, 30)
        wait_for("app /docs and /openapi.json", docs, 30)

    def check_observer(self) -> None:
        def health() -> str | None:
            code, body = get(self.observer + "/api/health")
            h = json.loads(body) if code == 200 else {}
            ok = h.get("status") == "ok" and h.get("connected", 0) >= 1
            return None if ok else f"{code} {body[:300]}"

        wait_for("observer /api/health: ok, following the app's KV events", health, 90)

    # ------------------------------------------------------------ loadgen
    def check_loadgen(self, logs: Callable[[], str]) -> None:
        """The load generator's own stats line: requests admitted and
        finished, no 4xx other than 409 back-offs, no 5xx, no transport
        error (it prints one every 10 s)."""
        seen: dict[str, int] = {}

        def stats() -> str | None:
            lines = [ln for ln in logs().splitlines() if "[loadgen] t=" in ln]
            if len(lines) < 2:
                return f"{len(lines)} stats line(s) so far"
            fields = dict(re.findall(r"(\w+)=(-?\d+)(?=\s|ms|$)", lines[-1]))
            seen.update({k: int(v) for k, v in fields.items()})
            errors = {k: seen.get(k) for k in ("4xx", "5xx", "transport")}
            if any(v != 0 for v in errors.values()):
                raise CheckFailed(f"loadgen reports errors {errors}: {lines[-1]}")
            if seen.get("admitted", 0) <= 0 or seen.get("finished", 0) <= 0:
                return f"nothing admitted and finished yet: {lines[-1]}"
            return None

        wait_for("loadgen drives the pool without errors", stats, 120)
        say(f"    loadgen: {seen}")

    # --------------------------------------------------------- prometheus
    def prom(self, path: str, **params: str) -> Any:
        url = self.prometheus + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        code, body = get(url)
        doc = json.loads(body)
        if code != 200 or doc.get("status") != "success":
            raise ValueError(f"{path} {params}: {code} {body[:300]}")
        return doc["data"]

    def check_targets(self, more_jobs: tuple[str, ...] = ()) -> None:
        def targets() -> str | None:
            active = self.prom("/api/v1/targets", state="active")["activeTargets"]
            jobs = {t["labels"]["job"] for t in active}
            missing = {"blockpool", "blockpool-observer", *more_jobs} - jobs
            if missing:
                return f"no target for {sorted(missing)}"
            down = [
                f"{t['scrapeUrl']}: {t['health']} {t.get('lastError', '')}"
                for t in active if t["health"] != "up"
            ]  # fmt: skip
            return "; ".join(down) if down else None

        wait_for("every Prometheus scrape target up", targets, 120)

    def check_counters_at_zero(self, names: list[str]) -> None:
        """Counters that must exist before anything happened (F3)."""

        def present() -> str | None:
            absent = [n for n in names if not self.prom("/api/v1/query", query=n)["result"]]
            return f"no series for {absent}" if absent else None

        wait_for(f"series present from the start: {', '.join(names)}", present, 60)

    def label_values(self, label: str, match: str | None) -> list[str]:
        params = {"match[]": match} if match else {}
        values: list[str] = self.prom(f"/api/v1/label/{label}/values", **params)
        return sorted(values)

    def check_dashboards(
        self, root: Path, deadline_s: float, profiles: tuple[str, ...] = ()
    ) -> int:
        """Every query of every dashboard under ``root`` answered with data
        (at least one series) by Prometheus -- those of series only a profile
        exports when it runs (``dashboards.PROFILE_METRICS``); returns how many."""
        files = dashboards.dashboard_files(root)
        if not files:
            raise CheckFailed(f"no Grafana dashboard under {root}")
        pending: dict[tuple[str, str, str, str], str] = {}
        problems: list[str] = []
        for path in files:
            n = skipped = 0
            for q in dashboards.queries(path, root):
                profile = dashboards.needs_profile(q.expr)
                if profile is not None and profile not in profiles:
                    skipped += 1
                    continue
                pending[(q.dashboard, q.panel, q.ref, q.expr)] = "not asked yet"
                n += 1
            extra = f" ({skipped} left for the profiles not running)" if skipped else ""
            say(f"    {path.relative_to(root)}: {n} queries{extra}")
        total = len(pending)

        def answered() -> str | None:
            variables: dict[str, dashboards.Variables] = {}
            for key in list(pending):
                file, panel, ref, expr = key
                if file not in variables:
                    doc = json.loads((root / file).read_text())
                    variables[file] = dashboards.Variables(doc, self.label_values)
                v = variables[file]
                if v.problems:
                    pending[key] = "; ".join(v.problems)
                    continue
                q = v.substitute(expr)
                left = dashboards.unresolved(q)
                if left:
                    problems.append(f"{file} / {panel} [{ref}]: unresolved {left} in {expr}")
                    del pending[key]
                    continue
                try:
                    result = self.prom("/api/v1/query", query=q)["result"]
                except ValueError as exc:
                    pending[key] = str(exc)
                    continue
                if result:
                    del pending[key]
                else:
                    pending[key] = f"no data for {q}"
            if problems:
                raise CheckFailed("\n".join(problems))
            if not pending:
                return None
            return f"{len(pending)} of {total} without data:\n" + "\n".join(
                f"      {f} / {p} [{r}]: {why}" for (f, p, r, _), why in sorted(pending.items())
            )

        wait_for(f"{total} dashboard queries answered with data", answered, deadline_s)
        return total


@dataclass
class VllmStack:
    """The ``vllm`` profile: the engine, the mirror of its pool, the observer
    of its KV events, the trace replay that drives it."""

    engine: str
    mirror: str
    observer: str

    def check(self, replay_logs: Callable[[], str]) -> None:
        def models() -> str | None:
            code, body = get(self.engine + "/v1/models")
            ids = [m["id"] for m in json.loads(body)["data"]] if code == 200 else []
            return None if "tiny" in ids else f"{code} {body[:200]}"

        wait_for("vLLM /v1/models serves the tiny model", models, 120)
        seen: dict[str, int] = {}

        def replay() -> str | None:
            lines = [ln for ln in replay_logs().splitlines() if "[vllm-replay] t=" in ln]
            if not lines:
                return "no stats line yet"
            seen.update({k: int(v) for k, v in re.findall(r"(\w+)=(\d+)(?=\s|$)", lines[-1])})
            if seen.get("errors", 0):
                raise CheckFailed(f"the trace replay reports errors: {lines[-1]}")
            if seen.get("ok", 0) < 10 or seen.get("cached_tokens", 0) <= 0:
                return f"not yet 10 completions with prefix hits: {lines[-1]}"
            return None

        wait_for("the trace replay drives vLLM without errors, with prefix hits", replay, 240)
        say(f"    vllm-replay: {seen}")

        def mirrored() -> str | None:
            code, body = get(self.mirror + "/api/mirror")
            m = json.loads(body) if code == 200 else {}
            return None if m.get("exact") is True else f"{code} {body[:400]}"

        wait_for("serve --mirror: the engine's pool, exact", mirrored, 120)

        fleet: dict[str, Any] = {}

        def observed() -> str | None:
            code, body = get(self.observer + "/api/health")
            h = json.loads(body) if code == 200 else {}
            if h.get("status") != "ok" or h.get("connected") != 1:
                return f"{code} {body[:300]}"
            code, body = get(self.observer + "/api/fleet/vllm")
            fleet.update(json.loads(body) if code == 200 else {})
            if fleet.get("task") != "running" or int(fleet.get("batches") or 0) < 10:
                return f"{code} {body[:300]}"
            return None

        wait_for("the observer is fed by vLLM's KV events", observed, 120)
        # Exactness needs every batch since seq 0: an observer that joins a
        # running engine has to get the start by replay.
        keys = ("exact", "inexact_reason", "batches", "gaps", "last_replay_failure", "poison")
        seen_by_observer = {k: fleet.get(k) for k in keys}
        say(f"    observer-vllm: {seen_by_observer}")
