"""A file read whole up to a bound: no more than one byte past it is read,
and a file past it is refused.  The trace reader's (blockpool/trace/workload/
reader.py) and the step model's saved scrape (blockpool/trace/fleet/stepfit.py)."""

from __future__ import annotations

from pathlib import Path


def read_bounded(path: str | Path, max_bytes: int) -> bytes:
    """The file's bytes; ValueError naming the file when it cannot be read
    (``cannot read PATH: why``) or holds more than ``max_bytes`` (``PATH:
    larger than N bytes``)."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than {max_bytes} bytes")
    return data
