"""The images the stack needs, on a machine that may reach no registry: the
Dockerfile's own base (``FROM``) made from Debian packages when it is not
there, a Prometheus from Debian's package when the compose file's is not
there, and the project's images built by compose from the project's own
Dockerfiles (build args only)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

from scripts.demo_check.daemon import DOCKER, Daemon
from scripts.demo_check.phases import say

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
LOCAL = ROOT / "docker" / "local"
LOCAL_LABEL = "org.blockpool.local-base"
# What the Dockerfile needs of its python:*-slim base, from Debian's packages.
BASE_PACKAGES = "python3,python3-venv,python-is-python3,ca-certificates,passwd,netbase"
EXTRA_CAS = Path("/usr/local/share/ca-certificates")
PROMETHEUS_DOCKERFILE = LOCAL / "Dockerfile.prometheus"


def local_prometheus() -> str:
    """The stand-in's tag: a new one whenever its Dockerfile changes."""
    digest = hashlib.sha256(PROMETHEUS_DOCKERFILE.read_bytes()).hexdigest()[:12]
    return f"blockpool-local/prometheus:2.42-debian-{digest}"


def base_image() -> str:
    """The image the project's Dockerfile builds ``FROM`` (its first stage)."""
    for line in DOCKERFILE.read_text().splitlines():
        m = re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)", line, re.IGNORECASE)
        if m:
            return m.group(1)
    raise RuntimeError(f"{DOCKERFILE}: no FROM")


def has_image(d: Daemon, ref: str) -> bool:
    return subprocess.run(
        [DOCKER, "image", "inspect", ref], env=d.env(), capture_output=True
    ).returncode == 0  # fmt: skip


def ensure_base(d: Daemon, cache: Path) -> str:
    """The Dockerfile's ``FROM`` image: the real one when present, else one
    imported from a Debian rootfs (mmdebstrap of bookworm, cached as a tar)."""
    ref = base_image()
    if has_image(d, ref):
        say(f"base {ref}: present")
        return ref
    tar = cache / "base-bookworm.tar"
    if not tar.is_file():
        if shutil.which("mmdebstrap") is None:
            raise RuntimeError("mmdebstrap is missing (Debian's mmdebstrap)")
        cache.mkdir(parents=True, exist_ok=True)
        part = cache / "base-bookworm.part.tar"
        cmd = ["mmdebstrap", "--quiet", "--variant=apt", f"--include={BASE_PACKAGES}"]
        if EXTRA_CAS.is_dir() and any(EXTRA_CAS.iterdir()):
            # A machine behind a TLS-inspecting proxy: pip inside the builds
            # must trust what the host trusts.
            cmd += [
                f"--customize-hook=copy-in {EXTRA_CAS} /usr/local/share/",
                '--customize-hook=chroot "$1" update-ca-certificates',
            ]
        say(f"base {ref}: not present, building a Debian bookworm rootfs ({tar})")
        subprocess.run([*cmd, "bookworm", str(part)], check=True)
        part.rename(tar)
    say(f"base {ref}: importing {tar}")
    d.docker(
        "import",
        "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change", "ENV LANG=C.UTF-8",
        "--change", f"LABEL {LOCAL_LABEL}=debian-bookworm",
        "--change", 'CMD ["python3"]',
        str(tar), ref,
    )  # fmt: skip
    return ref


def ensure_prometheus(d: Daemon, wanted: str, base: str) -> str:
    """``wanted`` when present, else Debian's prometheus on the base image."""
    if has_image(d, wanted):
        say(f"prometheus {wanted}: present")
        return wanted
    local = local_prometheus()
    if has_image(d, local):
        say(f"prometheus {wanted}: not present, {local} is")
    else:
        say(f"prometheus {wanted}: not present, building {local} (Debian's package)")
        d.docker(
            "build", "--network", "host", "--build-arg", f"BASE={base}",
            "-f", str(PROMETHEUS_DOCKERFILE), "-t", local, str(LOCAL),
        )  # fmt: skip
    return local
