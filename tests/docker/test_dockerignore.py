""".dockerignore, read with Docker's pattern rules: it keeps .venv, .git,
caches and test artifacts out of the build context, and lets every file a
Dockerfile copies in (and those COPY sources exist)."""

from __future__ import annotations

import os
import re

from tests.docker.helpers import DOCKERFILES, OTHER_DOCKERFILES, ROOT, instructions


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
    for dockerfile in [*DOCKERFILES, OTHER_DOCKERFILES[0]]:  # the root's context
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
