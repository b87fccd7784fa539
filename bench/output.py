"""Where a bench script writes its figures: a JSON file, and a line saying so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, doc: dict[str, Any], note: str = "") -> None:
    """``doc`` as indented JSON at ``path`` (its folder made), then ``wrote PATH``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}{note}")
