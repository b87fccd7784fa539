"""Where the dashboard's files are: ``frontend/`` beside the ``app`` package.

In a source checkout (and the Docker image) that is the repository's
``frontend/`` folder; in an installed wheel it is the ``frontend`` package
data that the wheel puts into site-packages next to ``app/`` (see
``[tool.setuptools]`` in pyproject.toml).  Both are found the same way: the
folder beside the running ``app`` package first — so a checkout never serves
another install's files — then wherever the import system finds ``frontend``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BESIDE = Path(__file__).resolve().parent.parent.parent / "frontend"


def frontend_dir() -> Path | None:
    """The folder holding index.html and fleet.html, or None when the
    dashboard is not installed (the API still serves)."""
    candidates = [BESIDE]
    try:
        spec = importlib.util.find_spec("frontend")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        candidates.extend(Path(p) for p in spec.submodule_search_locations or ())
    for folder in candidates:
        if (folder / "index.html").is_file() and (folder / "fleet.html").is_file():
            return folder
    return None
