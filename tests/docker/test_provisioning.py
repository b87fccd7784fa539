"""Prometheus and Grafana provisioning (docker/prometheus, docker/grafana)
point at each other and at the app, as compose.yaml mounts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.docker.helpers import (
    DASHBOARD,
    DASHBOARD_PROVIDERS,
    DOCKER,
    PROMETHEUS_YML,
    TARGET_LABELS,
    datasource,
)


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


def test_grafana_provisioning(compose: dict[str, Any]) -> None:
    graf = compose["services"]["grafana"]
    env = graf["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert graf["depends_on"]["prometheus"]["condition"] == "service_healthy"
    mounts = _mounts(graf)
    assert mounts["/etc/grafana/provisioning"].resolve() == (DOCKER / "grafana/provisioning")
    ds = datasource()
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
