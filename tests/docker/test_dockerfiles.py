"""Both Dockerfiles: ``hadolint`` passes, and they are read here for pinned
bases, a non-root user, the health check, the served command and where the
app and the page land; the CPU and CUDA torch flavours."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.main import FRONTEND
from tests.docker.helpers import (
    DOCKER,
    DOCKERFILES,
    OTHER_DOCKERFILES,
    ROOT,
    final_stage,
    instructions,
    instructions_text,
    run_tool,
    tool,
)


@pytest.mark.parametrize("dockerfile", DOCKERFILES + OTHER_DOCKERFILES, ids=lambda p: p.name)
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
