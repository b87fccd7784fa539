"""make demo-check: install what is missing, start a Docker daemon of our
own, build the images, bring the compose stack up, probe it, take it down,
stop the daemon.  Every phase's time is printed, and the total.

    python -m scripts.demo_check [--screenshot docs/compose-demo.png] [--torch]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import FrameType

from scripts.demo_check import images, wheels
from scripts.demo_check.daemon import Daemon
from scripts.demo_check.phases import Phases, say
from scripts.demo_check.probes import CheckFailed, Stack, VllmStack

ROOT = images.ROOT
DOCKER_DIR = ROOT / "docker"
PROJECT = "blockpool"
PACKAGES = {"dockerd": "docker.io", "mmdebstrap": "mmdebstrap", "promtool": "prometheus"}
COMPOSE = Path(sys.executable).parent / "docker-compose"  # the dev extra's Compose v5
# Counters that must be there at 0 before anything happened (F3).
AT_ZERO = ["blockpool_observer_poison_messages_total"]
VLLM_JOBS = ("vllm", "blockpool-mirror", "blockpool-observer-vllm")


def install_missing() -> None:
    need = sorted({pkg for tool, pkg in PACKAGES.items() if shutil.which(tool) is None})
    if not need:
        say("docker.io, mmdebstrap, prometheus: installed")
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"missing {need}: run as root (apt-get install)")
    # Installing docker.io must not start the system's daemon.
    policy = Path("/usr/sbin/policy-rc.d")
    ours = not policy.exists()
    if ours:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
        subprocess.run([*apt, "update", "-qq"], check=True, env=env)
        subprocess.run([*apt, "install", "-y", "-qq", *need], check=True, env=env)
    finally:
        if ours:
            policy.unlink()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Compose:
    def __init__(self, d: Daemon, env: dict[str, str]) -> None:
        self.env = {**d.env(), "DOCKER_BUILDKIT": "0", "COMPOSE_PROJECT_NAME": PROJECT, **env}
        self.files = ["-f", "compose.yaml", "-f", "compose.local.yaml"]

    def __call__(self, *args: str, capture: bool = False) -> str:
        proc = subprocess.run(
            [str(COMPOSE), *self.files, *args], cwd=DOCKER_DIR, env=self.env, text=True,
            stdout=subprocess.PIPE if capture else None, check=True,
        )  # fmt: skip
        return proc.stdout or ""

    def logs(self, service: str) -> str:
        return self("logs", "--no-color", service, capture=True)


def leftovers(d: Daemon) -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    out = []
    for kind in ("container", "network", "volume"):
        extra = ["-a"] if kind == "container" else []
        names = d.docker(kind, "ls", *extra, "-q", "--filter", label, capture=True).stdout.split()
        out += [f"{kind} {n}" for n in names]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="demo-check", description=__doc__)
    ap.add_argument("--state", type=Path, default=Path("/var/lib/blockpool-demo"),
                    help="the daemon's data root (kept: the image cache) and log")  # fmt: skip
    ap.add_argument("--run", type=Path, default=Path("/run/blockpool-demo"),
                    help="the daemon's socket, exec root and pidfile")  # fmt: skip
    ap.add_argument("--cache", type=Path, default=Path("/var/cache/blockpool-demo"),
                    help="the Debian rootfs tar of the local base image")  # fmt: skip
    ap.add_argument("--torch", action="store_true",
                    help="with torch (compose's TORCH_VERSION, TORCH_INDEX_URL)")  # fmt: skip
    ap.add_argument("--vllm", action="store_true",
                    help="the vllm profile too (a real engine)")  # fmt: skip
    ap.add_argument("--screenshot", type=Path, help="save the page, as the stack serves it")
    ap.add_argument("--dashboards", type=Path, default=DOCKER_DIR / "grafana",
                    help="the folder whose dashboard JSON files are checked")  # fmt: skip
    ap.add_argument("--dashboard-wait", type=float, default=240,
                    help="seconds for every dashboard query to have data")  # fmt: skip
    args = ap.parse_args()

    def on_signal(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 signal handler signature
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    phases = Phases()
    daemon = Daemon(args.state, args.run)
    compose: Compose | None = None
    index: wheels.WheelIndex | None = None
    failed: str | None = None
    try:
        with phases.phase("install what is missing"):
            install_missing()
        with phases.phase("own dockerd"):
            daemon.start()
        names = ["BLOCKPOOL_APP_PORT", "BLOCKPOOL_OBSERVER_PORT", "PROMETHEUS_PORT"]
        if args.vllm:
            names += [
                "BLOCKPOOL_VLLM_PORT",
                "BLOCKPOOL_MIRROR_PORT",
                "BLOCKPOOL_OBSERVER_VLLM_PORT",
            ]
        ports = {v: str(free_port()) for v in names}
        env = dict(ports)
        if args.vllm:
            env["COMPOSE_PROFILES"] = "vllm"
            torch = wheels.local_wheels("torch-2.13.0+cpu-*.whl")
            if torch and "TORCH_INDEX_URL" not in os.environ:
                index = wheels.WheelIndex(torch[:1])
                env["TORCH_INDEX_URL"] = index.url
        if not args.torch:
            env["TORCH_VERSION"] = ""  # no torch: the pool runs without K/V storage
        with phases.phase("base image and Prometheus image"):
            base = images.ensure_base(daemon, args.cache)
            wanted = os.environ.get("PROMETHEUS_IMAGE", "prom/prometheus:v3.5.0")
            env["PROMETHEUS_IMAGE"] = images.ensure_prometheus(daemon, wanted, base)
        compose = Compose(daemon, env)
        with phases.phase("clear what a failed run left"):
            compose("down", "-v", "--remove-orphans", "--timeout", "10")
        with phases.phase("build the project's images (docker/Dockerfile)"):
            compose("build")
        with phases.phase("up --wait"):
            compose("up", "-d", "--wait", "--wait-timeout", "900" if args.vllm else "600")
        stack = Stack(
            app=f"http://127.0.0.1:{ports['BLOCKPOOL_APP_PORT']}",
            observer=f"http://127.0.0.1:{ports['BLOCKPOOL_OBSERVER_PORT']}",
            prometheus=f"http://127.0.0.1:{ports['PROMETHEUS_PORT']}",
        )
        c = compose
        with phases.phase("probe: page, API, docs, observer, loadgen"):
            stack.check_app()
            stack.check_observer()
            stack.check_loadgen(lambda: c.logs("loadgen"))
        if args.vllm:
            vllm = VllmStack(
                engine=f"http://127.0.0.1:{ports['BLOCKPOOL_VLLM_PORT']}",
                mirror=f"http://127.0.0.1:{ports['BLOCKPOOL_MIRROR_PORT']}",
                observer=f"http://127.0.0.1:{ports['BLOCKPOOL_OBSERVER_VLLM_PORT']}",
            )
            with phases.phase("probe: vLLM, its mirror, its observer, the trace replay"):
                vllm.check(lambda: c.logs("vllm-load"))
        with phases.phase("probe: Prometheus targets and counters at 0"):
            stack.check_targets(VLLM_JOBS if args.vllm else ())
            stack.check_counters_at_zero(AT_ZERO)
        with phases.phase("probe: every dashboard query has data"):
            profiles = ("vllm",) if args.vllm else ()
            stack.check_dashboards(args.dashboards, args.dashboard_wait, profiles)
        if args.screenshot:
            with phases.phase("screenshot of the page"):
                screenshot(stack.app, args.screenshot)
        with phases.phase("down -v leaves nothing"):
            compose("down", "-v", "--timeout", "20")
            left = leftovers(daemon)
            if left:
                raise CheckFailed(f"left after down -v: {left}")
        compose = None
    except (CheckFailed, RuntimeError, subprocess.CalledProcessError, KeyboardInterrupt) as exc:
        failed = f"{type(exc).__name__}: {exc}"
    finally:
        if compose is not None:
            _teardown(compose)
        if index is not None:
            index.close()
        with phases.phase("stop own dockerd"):
            daemon.stop()
        phases.report()
    if failed:
        say(f"FAILED: {failed}")
        return 1
    say("PASSED")
    return 0


def _teardown(compose: Compose) -> None:
    """After a failure: what the stack said, then down -v."""
    for args in (("ps", "-a"), ("logs", "--no-color", "--tail", "40")):
        with contextlib.suppress(subprocess.CalledProcessError):
            compose(*args)
    try:
        compose("down", "-v", "--remove-orphans", "--timeout", "10")
    except subprocess.CalledProcessError as exc:
        say(f"down -v failed: {exc}")


def screenshot(url: str, path: Path) -> None:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    from tests.chromium import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url + "/", timeout=60_000)
            page.wait_for_load_state("networkidle", timeout=60_000)
            page.wait_for_function("document.querySelectorAll('canvas, svg').length > 0",
                                   timeout=60_000)  # fmt: skip
            path.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(path), full_page=False)
        finally:
            browser.close()
    say(f"screenshot: {path}")


if __name__ == "__main__":
    sys.exit(main())
