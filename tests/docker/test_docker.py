"""The compose demo (docker/), checked without a Docker engine.

- ``docker-compose config`` accepts the compose file (with and without the
  ``gpu`` profile), and its normalized model pins every image, has a health
  check on every service and binds the documented ports;
- ``hadolint`` passes on both Dockerfiles, which are also read here: pinned
  bases, non-root user, health check, the served command, COPY sources that
  exist and that .dockerignore lets through;
- Prometheus and Grafana provisioning point at each other and at the app;
- every PromQL expression of the Grafana dashboard names only series that a
  live app exposes (scraped from a real in-process app after churn), with
  label matchers that select something, and vLLM's own KV-cache panel
  queries evaluate against us;
- the load generator builds bodies the API's pydantic models accept, runs
  against a live uvicorn server with no 5xx, backs off on a full pool, and
  exits non-zero on repeated 5xx or a refused token.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.main import FRONTEND, create_app
from app.schemas import AdmitOp, AppendBody, BatchRequest
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]
DASHBOARD = DOCKER / "grafana" / "dashboards" / "blockpool.json"
PROMETHEUS_YML = DOCKER / "prometheus" / "prometheus.yml"
DATASOURCES = DOCKER / "grafana" / "provisioning" / "datasources"
DASHBOARD_PROVIDERS = DOCKER / "grafana" / "provisioning" / "dashboards"
LOADGEN = DOCKER / "loadgen" / "loadgen.py"
BIN = Path(sys.executable).parent

MODEL = "test-model"  # the live app's model_name; stands in for $model_name

# Metrics documented as the stream's (app/stream): the dashboard's "Stream
# health" row uses them.  While the stream is not wired into /metrics yet, a
# live app exposes no blockpool_stream_* at all and only these are excused;
# once any blockpool_stream_* series exists, all of them must.
STREAM_METRICS = {
    "blockpool_stream_clients",
    "blockpool_stream_frames_total",
    "blockpool_stream_bytes_total",
    "blockpool_stream_drops_total",
    "blockpool_stream_resyncs_total",
    "blockpool_stream_max_lag_frames",
}
# Labels Prometheus attaches to every scraped series (the target's labels).
TARGET_LABELS = {"job", "instance", "variant"}

# The KV-cache queries of vLLM's example Grafana dashboard
# (examples/online_serving/prometheus_grafana/grafana.json, "Cache
# Utilization" and "Scheduler State" panels; the V1 engine renamed
# vllm:gpu_cache_usage_perc to vllm:kv_cache_usage_perc), and the prefix-cache
# hit rate as vLLM's metrics design doc defines it from its two counters.
VLLM_REFERENCE = {
    "kv_cache_usage": 'vllm:kv_cache_usage_perc{model_name="$model_name"}',
    "prefix_cache_hit_rate": (
        'rate(vllm:prefix_cache_hits_total{model_name="$model_name"}[$__rate_interval])'
        " / "
        'rate(vllm:prefix_cache_queries_total{model_name="$model_name"}[$__rate_interval])'
    ),
    "num_requests_running": 'vllm:num_requests_running{model_name="$model_name"}',
}


def tool(name: str) -> Path:
    """A tool installed in the venv's bin dir (the dev extra): fail, never skip."""
    path = BIN / name
    assert path.is_file(), f"{path} is missing: install the dev extra (pip install -e '.[dev]')"
    return path


def run_tool(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # The compose file's defaults, not whatever this shell exports.
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("BLOCKPOOL_", "LOADGEN_", "GRAFANA_", "COMPOSE_", "DOCKER_"))
    }  # fmt: skip
    return subprocess.run(
        [str(a) for a in args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


# =============================================================== compose file


def compose_model(*profiles: str) -> dict[str, Any]:
    args: list[str | Path] = [tool("docker-compose"), "-f", COMPOSE]
    for p in profiles:
        args += ["--profile", p]
    proc = run_tool(*args, "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    model: dict[str, Any] = json.loads(proc.stdout)
    return model


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return compose_model("gpu")


@pytest.mark.parametrize("profiles", [(), ("gpu",)], ids=["default", "gpu"])
def test_compose_config_is_valid(profiles: tuple[str, ...]) -> None:
    args: list[str | Path] = [tool("docker-compose"), "-f", COMPOSE]
    for p in profiles:
        args += ["--profile", p]
    proc = run_tool(*args, "config", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "warn" not in proc.stderr.lower(), proc.stderr


def test_compose_services() -> None:
    assert set(compose_model()["services"]) == {"app", "loadgen", "prometheus", "grafana"}
    assert set(compose_model("gpu")["services"]) == {
        "app", "loadgen", "prometheus", "grafana", "app-gpu", "loadgen-gpu",
    }  # fmt: skip


def test_every_image_is_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc.get("image")
        assert image, f"{name}: no image name (a build needs one, with a tag)"
        ref = image.split("@", 1)[0]
        _, sep, tag = ref.rpartition(":")
        assert sep and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image} uses :latest"
        if "build" not in svc:
            assert re.search(r"\d", tag), f"{name}: {image}: pin a version, not a moving tag"


def test_every_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        hc = svc.get("healthcheck")
        assert hc and not hc.get("disable"), f"{name}: no health check"
        test = hc["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, f"{name}: {test}"
        assert hc.get("interval") and hc.get("timeout") and hc.get("retries"), name


def test_ports_are_the_documented_ones(compose: dict[str, Any]) -> None:
    expected = {
        "app": (8000, 8000), "app-gpu": (8001, 8000),
        "prometheus": (9090, 9090), "grafana": (3000, 3000),
    }  # fmt: skip
    for name, svc in compose["services"].items():
        ports = svc.get("ports", [])
        if name not in expected:
            assert not ports, f"{name} publishes {ports}: it serves nothing"
            continue
        assert len(ports) == 1, f"{name}: {ports}"
        (p,) = ports
        assert (int(p["published"]), int(p["target"])) == expected[name], p
        # Loopback unless BLOCKPOOL_BIND says otherwise: the demo has no auth.
        assert p.get("host_ip") == "127.0.0.1", p
    doc = (DOCKER / "README.md").read_text()
    for port in ("8000", "9090", "3000"):
        assert f"localhost:{port}" in doc, f"docker/README.md does not document port {port}"


def test_app_service(compose: dict[str, Any]) -> None:
    app = compose["services"]["app"]
    assert app["build"]["dockerfile"] == "docker/Dockerfile"
    assert Path(app["build"]["context"]).resolve() == ROOT
    env = app["environment"]
    assert env["BLOCKPOOL_PORT"] == "8000" and env["BLOCKPOOL_HOST"] == "0.0.0.0"
    assert env["BLOCKPOOL_DEMO"] == "true"
    Settings(**{k.removeprefix("BLOCKPOOL_").lower(): v for k, v in env.items()})
    assert "/api/health" in " ".join(app["healthcheck"]["test"])


@pytest.mark.parametrize(("name", "target"), [("loadgen", "app"), ("loadgen-gpu", "app-gpu")])
def test_loadgen_service(compose: dict[str, Any], name: str, target: str) -> None:
    svc = compose["services"][name]
    assert svc["environment"]["BLOCKPOOL_URL"] == f"http://{target}:8000"
    assert svc["depends_on"][target]["condition"] == "service_healthy"
    assert svc["entrypoint"] == ["python", "/opt/loadgen/loadgen.py"]
    # The image that carries the script is built here, never pulled.
    assert svc["build"]["dockerfile"] == "docker/Dockerfile"
    assert svc["image"] == compose["services"]["app"]["image"]
    heartbeat = svc["environment"]["LOADGEN_HEARTBEAT"]
    assert heartbeat in " ".join(svc["healthcheck"]["test"])
    assert "COPY docker/loadgen/loadgen.py /opt/loadgen/loadgen.py" in instructions_text(
        DOCKER / "Dockerfile"
    )


def test_gpu_profile(compose: dict[str, Any]) -> None:
    for name in ("app-gpu", "loadgen-gpu"):
        assert compose["services"][name]["profiles"] == ["gpu"]
    gpu = compose["services"]["app-gpu"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert gpu["image"].endswith("-cuda")
    (dev,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    assert gpu["environment"]["BLOCKPOOL_STORAGE_DEVICE"] == "cuda"
    assert gpu["environment"]["BLOCKPOOL_MODEL_NAME"] != "blockpool-demo"


def _mounts(svc: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts."""
    return {v["target"]: Path(v["source"]) for v in svc["volumes"] if v["type"] == "bind"}


def test_prometheus_scrapes_the_app(compose: dict[str, Any]) -> None:
    prom = compose["services"]["prometheus"]
    config_flag = next(a for a in prom["command"] if a.startswith("--config.file="))
    mounted = _mounts(prom)[config_flag.split("=", 1)[1]]
    assert mounted.resolve() == PROMETHEUS_YML.resolve()
    assert all(v.get("read_only") for v in prom["volumes"] if v["type"] == "bind")
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    job = jobs["blockpool"]
    assert job.get("scrape_interval", cfg["global"]["scrape_interval"]) == "5s"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["app:8000"]
    gpu = jobs["blockpool-gpu"]
    assert gpu["dns_sd_configs"][0]["names"] == ["app-gpu"]
    assert gpu["dns_sd_configs"][0]["port"] == 8000
    assert gpu.get("scrape_interval", cfg["global"]["scrape_interval"]) == "5s"
    # The target labels the dashboard may rely on are the ones allowed here.
    for j in cfg["scrape_configs"]:
        for sc in j.get("static_configs", []):
            assert set(sc.get("labels", {})) <= TARGET_LABELS
        for rc in j.get("relabel_configs", []):
            assert rc["target_label"] in TARGET_LABELS


def _datasource() -> dict[str, Any]:
    files = sorted(DATASOURCES.glob("*.yml"))
    assert files, "no Grafana datasource provisioning file"
    sources = [d for f in files for d in yaml.safe_load(f.read_text())["datasources"]]
    (prom,) = [d for d in sources if d["type"] == "prometheus"]
    return prom


def test_grafana_provisioning(compose: dict[str, Any]) -> None:
    graf = compose["services"]["grafana"]
    env = graf["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert graf["depends_on"]["prometheus"]["condition"] == "service_healthy"
    mounts = _mounts(graf)
    assert mounts["/etc/grafana/provisioning"].resolve() == (DOCKER / "grafana/provisioning")
    ds = _datasource()
    assert ds["url"] == "http://prometheus:9090" and ds["access"] == "proxy"
    assert int(compose["services"]["prometheus"]["ports"][0]["target"]) == 9090
    providers = [
        p for f in sorted(DASHBOARD_PROVIDERS.glob("*.yml"))
        for p in yaml.safe_load(f.read_text())["providers"]
    ]  # fmt: skip
    (provider,) = providers
    path = provider["options"]["path"]
    assert mounts[path].resolve() == DASHBOARD.parent.resolve()
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{path}/{DASHBOARD.name}"


# ================================================================ Dockerfiles


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path}: unfinished continuation"
    return out


def instructions_text(path: Path) -> str:
    return "\n".join(f"{i} {a}" for i, a in instructions(path))


def final_stage(path: Path) -> list[tuple[str, str]]:
    ins = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path) -> None:
    proc = run_tool(tool("hadolint"), dockerfile)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # An ignored rule needs a reason on the comment line just above it.
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            above = lines[i - 1].strip() if i else ""
            assert above.startswith("#") and len(above) > 20, f"{dockerfile}:{i + 1}: why?"
    assert not (ROOT / ".hadolint.yaml").exists() and not (ROOT / ".hadolint.yml").exists()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_shape(dockerfile: Path) -> None:
    ins = instructions(dockerfile)
    stages: set[str] = set()
    for word, args in ins:
        if word != "FROM":
            continue
        parts = args.split()
        image = next(p for p in parts if not p.startswith("--"))
        if image.lower() not in stages:
            _, sep, tag = image.partition(":")
            assert sep and re.fullmatch(r"\d+(\.\d+)+[-\w.]*", tag), f"{image}: pin the tag"
            assert "latest" not in tag
        if len(parts) >= 3 and parts[-2].upper() == "AS":
            stages.add(parts[-1].lower())
    final = final_stage(dockerfile)
    words = [w for w, _ in final]
    user = [a for w, a in final if w == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0"), "run as a non-root user"
    hc = " ".join(a for w, a in final if w == "HEALTHCHECK")
    assert "/api/health" in hc and "CMD" in hc
    assert "EXPOSE" in words and any(a.split()[0] == "8000" for w, a in final if w == "EXPOSE")
    entry = json.loads(next(a for w, a in final if w == "ENTRYPOINT"))
    cmd = json.loads(next(a for w, a in final if w == "CMD"))
    assert entry + cmd == ["blockpool", "serve", "--host", "0.0.0.0"]
    env = " ".join(a for w, a in final if w == "ENV")
    assert "BLOCKPOOL_DEMO=true" in env and "BLOCKPOOL_PORT=8000" in env
    # The dashboard is found next to the app package: frontend/ must land in
    # the same folder as app/ (see app.main.FRONTEND).
    assert FRONTEND.parent == ROOT
    dests = {}
    for w, a in ins:
        if w == "COPY" and "--from" not in a:
            *srcs, dest = a.split()
            for s in srcs:
                dests[s.rstrip("/")] = dest
    assert dests["frontend"] == "/srv/blockpool/frontend"
    assert dests["app"] == "./app" and "WORKDIR /srv/blockpool" in instructions_text(dockerfile)


def test_torch_flavours() -> None:
    cpu = instructions_text(DOCKER / "Dockerfile")
    cuda = instructions_text(DOCKER / "Dockerfile.cuda")
    assert "download.pytorch.org/whl/cpu" in cpu
    assert "torch==$TORCH_VERSION" in cuda and "whl/cpu" not in cuda
    assert "BLOCKPOOL_STORAGE_DEVICE=cuda" in cuda


# ---------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore pattern (Go filepath.Match plus **) as a regex."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif c == "*":
            out, i = out + "[^/]*", i + 1
        elif c == "?":
            out, i = out + "[^/]", i + 1
        elif c == "[":
            j = pattern.index("]", i + 1)
            body = pattern[i + 1 : j]
            out += "[" + ("^" + body[1:] if body.startswith("!") else body) + "]"
            i = j + 1
        else:
            out, i = out + re.escape(c), i + 1
    return re.compile(out)


def dockerignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the build context leaves ``path`` out (the last matching
    pattern wins; a pattern matching a parent folder matches its contents)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for negated, rx in patterns:
        if any(rx.fullmatch(p) for p in prefixes):
            ignored = not negated
    return ignored


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    out = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        out.append((negated, _pattern_regex(line)))
    return out


def test_dockerignore_pattern_semantics() -> None:
    pats = [(False, _pattern_regex("*")), (True, _pattern_regex("app")),
            (False, _pattern_regex("**/__pycache__"))]  # fmt: skip
    assert dockerignored("x.txt", pats) and dockerignored("tests/a.py", pats)
    assert not dockerignored("app/main.py", pats)
    assert dockerignored("app/__pycache__/main.cpython-311.pyc", pats)


def test_dockerignore_keeps_the_context_small() -> None:
    pats = dockerignore_patterns()
    for path in (".venv/bin/python", ".git/HEAD", "test-artifacts/report.xml", "tests/x.py",
                 ".pytest_cache/v", ".mypy_cache/x", "blockpool.egg-info/PKG-INFO",
                 "app/__pycache__/main.cpython-311.pyc", "frontend/node_modules/x/y.js",
                 "bench/results/r.json", ".hypothesis/x", "docker/compose.yaml"):  # fmt: skip
        assert dockerignored(path, pats), f"{path} would be sent to the builder"
    # ... and every file a Dockerfile copies gets through.
    for dockerfile in DOCKERFILES:
        for word, args in instructions(dockerfile):
            if word != "COPY" or "--from" in args:
                continue
            for src in args.split()[:-1]:
                src_path = ROOT / src.rstrip("/")
                assert src_path.exists(), f"{dockerfile.name}: COPY {src}: no such path"
                files = [src_path] if src_path.is_file() else [
                    p for p in src_path.rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts
                ]  # fmt: skip
                assert files, f"{dockerfile.name}: COPY {src} copies nothing"
                for f in files:
                    rel = f.relative_to(ROOT).as_posix()
                    assert not dockerignored(rel, pats), f"{dockerfile.name}: {rel} is ignored"


# =================================================================== PromQL


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


def test_selector_extraction() -> None:
    expr = (
        "histogram_quantile(0.9, sum by (le, job) (rate(vllm:kv_block_lifetime_seconds_bucket"
        '{model_name=~"$model_name", job=~"$job"}[$__rate_interval]))) / on (job) '
        "group_left sum without (state) (blockpool_blocks offset 5m) > bool 2e3"
    )
    sels = selectors(expr)
    assert [s.name for s in sels] == ["vllm:kv_block_lifetime_seconds_bucket", "blockpool_blocks"]
    assert sels[0].wrapped_by == "rate" and sels[1].wrapped_by == "sum"
    assert selectors("a_total / b")[1].wrapped_by is None
    assert selectors("histogram_quantile(0.5, x_bucket)")[0].wrapped_by == "histogram_quantile"
    assert sels[0].matchers == (("model_name", "=~", "$model_name"), ("job", "=~", "$job"))
    assert selectors('label_values(vllm:cache_config_info{job=~"$job"}, model_name)')[0].name == (
        "vllm:cache_config_info"
    )


# ------------------------------------------------------------ the live series


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


async def _churn() -> Live:
    """A real app, driven through its REST API until every histogram has
    samples: shared prefixes (hits, reuse), unique prompts that evict them,
    a batch, a reset (AllBlocksCleared)."""
    settings = Settings(
        num_blocks=64, block_size=16, metrics_sample_rate=1.0, model_name=MODEL, demo=False
    )
    app = create_app(settings)
    rng = random.Random(7)

    def toks(n: int) -> list[int]:
        return [rng.randrange(32000) for _ in range(n)]

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:

            async def ok(method: str, path: str, body: Any = None) -> dict[str, Any]:
                r = await c.request(method, path, json=body)
                assert r.status_code < 300, (path, r.status_code, r.text)
                data: dict[str, Any] = r.json()
                return data

            async def scrape() -> Scrape:
                r = await c.get("/metrics")
                assert r.status_code == 200
                return Scrape(time.monotonic(), r.text, await ok("GET", "/api/summary"))

            prefix = toks(160)
            await ok("POST", "/api/requests", {"request_id": "p0", "token_ids": prefix + toks(20)})
            await ok("POST", "/api/requests/p0/finish")
            first = await scrape()
            for i in range(1, 4):
                await asyncio.sleep(0.01)
                body = {"request_id": f"p{i}", "token_ids": prefix + toks(20)}
                adm = await ok("POST", "/api/requests", body)
                assert adm["num_hit_blocks"] > 0
                await ok("POST", f"/api/requests/p{i}/tokens", {"token_ids": toks(24)})
                await ok("POST", f"/api/requests/p{i}/finish")
            for i in range(8):  # unique prompts: the pool's 63 blocks turn over
                await ok("POST", "/api/requests", {"request_id": f"u{i}", "token_ids": toks(320)})
                await ok("POST", f"/api/requests/u{i}/finish")
            batch = {
                "ops": [
                    {"op": "admit", "request_id": "b0", "token_ids": prefix + toks(5)},
                    {"op": "append", "request_id": "b0", "token_ids": toks(3)},
                    {"op": "finish", "request_id": "b0"},
                ]
            }
            assert (await ok("POST", "/api/batch", batch))["failed"] == 0
            await ok("POST", "/api/pool/reset")
            await ok("POST", "/api/requests", {"request_id": "r0", "token_ids": prefix})
            last = await scrape()
            await ok("POST", "/api/requests/r0/finish")
    return Live(first, last)


@pytest.fixture(scope="module")
def live() -> Live:
    result = asyncio.run(_churn())
    for name in ("lifetime", "idle_before_evict", "reuse_gap"):
        count = [
            v for n, _, v, _ in result.last.samples()
            if n == f"vllm:kv_block_{name}_seconds_count"
        ]  # fmt: skip
        assert count and count[0] > 0, f"no {name} samples: not enough churn"
    return result


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
    val = val.replace("$model_name", MODEL)
    have = labels.get(lbl, "")
    if op == "=":
        return have == val
    if op == "!=":
        return have != val
    hit = re.fullmatch(val, have) is not None
    return hit if op == "=~" else not hit


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expression) for every query of the dashboard."""
    out = []
    for panel in dashboard()["panels"]:
        for t in panel.get("targets", []):
            out.append((panel["title"], t["expr"]))
    for name, inner, _ in variable_queries():
        out.append((f"${name}", inner))
    return out


def variable_queries() -> list[tuple[str, str, str]]:
    """(variable, series expression, label) of each label_values() variable."""
    out = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(rf"\s*label_values\((.+),\s*({NAME})\s*\)\s*", q)
        assert m, f"${var['name']}: only label_values(series, label) is used: {q}"
        out.append((var["name"], m.group(1), m.group(2)))
    return out


# ------------------------------------------------------------------ dashboard


def test_dashboard_json_is_valid() -> None:
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["panels"], list)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    uid = _datasource()["uid"]
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["targets"], f"{p['title']}: no query"
        assert p["datasource"]["uid"] == uid, p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == uid, p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    variables = {v["name"] for v in d["templating"]["list"]}
    for _, expr in dashboard_exprs():
        for var in re.findall(r"\$(\w+)", expr):
            assert var in variables or var.startswith("__"), f"${var} is not defined"


def test_dashboard_has_the_issue_panels() -> None:
    exprs = [e for _, e in dashboard_exprs()]
    panels = {p["title"]: p for p in dashboard()["panels"]}

    def has(pattern: str) -> bool:
        return any(re.search(pattern, e) for e in exprs)

    blocks = panels["Blocks by state"]
    assert "by (state)" in blocks["targets"][0]["expr"]
    assert blocks["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert has(r"^vllm:kv_cache_usage_perc\{")
    assert has(
        r"rate\(vllm:prefix_cache_hits_total\{[^}]*\}\[\$__rate_interval\]\)\)"
        r"\s*/\s*sum by \(job\) \(rate\(vllm:prefix_cache_queries_total"
    )
    assert has(r"rate\(blockpool_evictions_total") and has(r"rate\(blockpool_blocks_allocated")
    for name in ("lifetime", "idle_before_evict", "reuse_gap"):
        quantile = r"histogram_quantile\(0\.\d+, sum by \((job, )?le\) \(rate\("
        assert has(rf"{quantile}vllm:kv_block_{name}_seconds_bucket"), name
    assert has(r"sum by \(type\) \(rate\(blockpool_kv_events_total")
    stream = {s.name for e in exprs for s in selectors(e) if s.name.startswith("blockpool_stream")}
    assert stream == STREAM_METRICS


def test_dashboard_queries_name_live_series(live: Live) -> None:
    errors = []
    used = set()
    for title, expr in dashboard_exprs():
        sels = selectors(expr)
        assert sels, f"{title}: {expr} names no metric"
        for sel in sels:
            used.add(sel.name)
            errors += [f"{title}: {e}" for e in check_selector(sel, live.last)]
    for name, inner, label in variable_queries():
        (sel,) = selectors(inner)
        found = [lb for n, lb, _, _ in live.last.samples() if n == sel.name]
        if label not in TARGET_LABELS and not any(label in lb for lb in found):
            errors.append(f"${name}: {sel.name} has no label {label!r}")
    assert not errors, "\n".join(errors)
    assert len(used) >= 20, sorted(used)


def test_name_checks_catch_mistakes(live: Live) -> None:
    """The suffix rules: a counter is only there as _total, a histogram as
    _bucket/_sum/_count, and rate() of a gauge or a typo'd label is caught."""
    bad = (
        "rate(vllm:prefix_cache_hits[1m])",  # a counter is there only as _total
        "vllm:kv_block_lifetime_seconds",  # a histogram only as _bucket/_sum/_count
        "blockpool_blocks_total",  # a gauge has no _total
        "rate(blockpool_free_blocks[1m])",  # rate() of a gauge
        "histogram_quantile(0.5, vllm:kv_block_lifetime_seconds_bucket)",  # no rate()
        'blockpool_blocks{state="inuse"}',  # no such state
        'vllm:kv_cache_usage_perc{model_name="other"}',  # another model
        "rate(blockpool_stream_typo_total[1m])",  # not a documented stream metric
    )
    for expr in bad:
        (sel,) = selectors(expr)
        assert check_selector(sel, live.last), f"{expr} should be refused"
    good = (
        "rate(vllm:prefix_cache_hits_total[1m])",
        "rate(vllm:kv_block_lifetime_seconds_count[1m])",
        'blockpool_blocks{state="in_use"}',
        'sum by (type) (blockpool_kv_events_total{type="BlockRemoved"})',
    )
    for expr in good:
        for sel in selectors(expr):
            assert not check_selector(sel, live.last), expr


# -------------------------------------------------- vLLM's panels evaluate


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


def test_vllm_kv_cache_panels_evaluate(live: Live) -> None:
    usage = evaluate(VLLM_REFERENCE["kv_cache_usage"], live)
    assert len(usage) == 1
    (value,) = usage.values()
    assert value == pytest.approx(live.last.summary["usage"]) and 0 < value <= 1

    hit_rate = evaluate(VLLM_REFERENCE["prefix_cache_hit_rate"], live)
    assert len(hit_rate) == 1, "hits and queries must carry the same labels"
    (value,) = hit_rate.values()
    a, b = live.first.summary["prefix_cache"], live.last.summary["prefix_cache"]
    expected = (b["hits_tokens"] - a["hits_tokens"]) / (b["queries_tokens"] - a["queries_tokens"])
    assert value == pytest.approx(expected) and 0 < value < 1

    running = evaluate(VLLM_REFERENCE["num_requests_running"], live)
    assert list(running.values()) == [live.last.summary["running_requests"]] == [1]
    for labels in (*usage, *hit_rate, *running):
        assert dict(labels)["model_name"] == MODEL and dict(labels)["engine"] == "0"


# ================================================================= loadgen


@pytest.fixture(scope="module")
def loadgen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("blockpool_loadgen", LOADGEN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_loadgen_bodies_match_the_api_models(loadgen: ModuleType) -> None:
    wl = loadgen.Workload(random.Random(3))
    kinds = set()
    prompts = []
    for _ in range(300):
        prompt = wl.next_prompt()
        kinds.add(prompt.kind)
        rid = wl.new_request_id()
        AdmitOp.model_validate(loadgen.admit_body(rid, prompt))
        chunks = wl.decode_plan(8, 96)
        assert 8 <= sum(chunks) <= 96 and all(1 <= n <= 16 for n in chunks)
        AppendBody.model_validate(loadgen.append_body(wl.tokens(chunks[0])))
        batch = BatchRequest.model_validate(
            loadgen.batch_body(rid, prompt, [wl.tokens(n) for n in chunks])
        )
        assert [op.op for op in batch.ops][:2] == ["prefix_lookup", "admit"]
        assert batch.ops[-1].op == "finish" and batch.on_error == "continue"
        wl.end_turn(prompt, wl.tokens(10), ok=True)
        prompts.append(prompt.token_ids)
    assert kinds == {"chat", "document", "conversation", "noise"}
    # Shared prefixes: many prompts start with the same 64 tokens.
    heads: dict[tuple[int, ...], int] = {}
    for p in prompts:
        heads[tuple(p[:64])] = heads.get(tuple(p[:64]), 0) + 1
    assert max(heads.values()) >= 20
    assert len({wl.new_request_id() for _ in range(100)}) == 100


def test_loadgen_settings_from_env(loadgen: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOCKPOOL_URL", "http://app:8000/")
    monkeypatch.setenv("BLOCKPOOL_TOKEN", "s3cret")
    cfg = loadgen.parse_args(["--duration", "3"])
    assert (cfg.url, cfg.token, cfg.duration, cfg.stats_interval) == (
        "http://app:8000", "s3cret", 3.0, 10.0,
    )  # fmt: skip
    gen = loadgen.LoadGen(cfg)
    assert gen.client.headers["authorization"] == "Bearer s3cret"
    asyncio.run(gen.client.aclose())
    monkeypatch.setenv("BLOCKPOOL_TOKEN", "")
    assert loadgen.parse_args([]).token is None


@pytest.fixture
def uvicorn_server() -> Iterator[str]:
    import uvicorn

    app = create_app(Settings(num_blocks=1024, demo=False))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_loadgen_short_run_against_uvicorn(uvicorn_server: str) -> None:
    env = {**os.environ, "BLOCKPOOL_URL": uvicorn_server}
    env.pop("BLOCKPOOL_TOKEN", None)
    proc = subprocess.run(
        [sys.executable, str(LOADGEN), "--duration", "3", "--stats-interval", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[loadgen] t=")]
    assert len(lines) >= 3, proc.stdout  # a line per second, and the final one
    final = dict(kv.split("=", 1) for kv in lines[-1].split()[1:])
    assert final["5xx"] == "0" and final["4xx"] == "0" and final["transport"] == "0"
    assert int(final["admitted"]) > 0 and int(final["finished"]) == int(final["admitted"])
    assert int(final["decode_tokens"]) > 0 and float(final["hit_rate"]) > 0
    # Every request it admitted was finished: none is left holding blocks.
    left = httpx.get(f"{uvicorn_server}/api/requests", params={"limit": 1000}).json()
    assert "lg-" not in json.dumps(left)
    summary = httpx.get(f"{uvicorn_server}/api/summary").json()
    assert summary["running_requests"] == 0 and summary["blocks"]["in_use"] == 0


def test_loadgen_backs_off_when_the_pool_is_full(loadgen: ModuleType) -> None:
    async def go() -> Any:
        app = create_app(Settings(num_blocks=160, demo=False))
        async with app.router.lifespan_context(app):
            cfg = loadgen.Config(url="http://test", duration=2.0, stats_interval=1.0,
                                 concurrency=8, seed=5, think_time=0.0)  # fmt: skip
            gen = loadgen.LoadGen(cfg, httpx.ASGITransport(app=app))
            code = await gen.run()
            return code, gen.stats, app.state.engine.manager.requests

    code, stats, running = asyncio.run(go())
    assert code == 0
    assert stats.status_409 > 0 and stats.status_5xx == 0 and stats.status_4xx == 0
    assert stats.admit_retries > 0 or stats.preempted > 0
    assert stats.admitted > 0 and not running


def test_loadgen_exits_nonzero_on_repeated_5xx(loadgen: ModuleType) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(500, json={"error": {"status": 500, "code": "internal"}})

    cfg = loadgen.Config(url="http://test", duration=30.0, max_5xx=5, concurrency=2)
    t0 = time.monotonic()
    code = asyncio.run(loadgen.run(cfg, httpx.MockTransport(handler)))
    assert code == loadgen.EXIT_5XX == 1
    assert time.monotonic() - t0 < 10


def test_loadgen_exits_when_the_token_is_refused(loadgen: ModuleType) -> None:
    async def go() -> int:
        app = create_app(Settings(num_blocks=64, demo=False, token="right"))
        async with app.router.lifespan_context(app):
            cfg = loadgen.Config(url="http://test", duration=30.0, token="wrong")
            code: int = await loadgen.run(cfg, httpx.ASGITransport(app=app))
            return code

    assert asyncio.run(go()) == loadgen.EXIT_AUTH
