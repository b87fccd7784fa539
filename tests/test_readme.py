"""The README's library example runs and prints what its comments say."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_library_example_runs_as_documented() -> None:
    text = README.read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None, "the README lost its library example"
    code = block.group(1)
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    pool = namespace["pool"]
    a, b = namespace["a"], namespace["b"]
    assert a.block_ids == [[1, 2, 3]]  # type: ignore[attr-defined]
    assert b.block_ids == [[1, 2, 4]] and b.num_hit_blocks == 2  # type: ignore[attr-defined]
    order = [blk.block_id for blk in pool.free_block_queue]  # type: ignore[attr-defined]
    assert "# [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]" in code
    assert order == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]


def test_readme_names_the_two_setup_commands_the_makefile_has() -> None:
    text = README.read_text()
    makefile = (README.parent / "Makefile").read_text()
    assert "make run" in text and "make test" in text
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    ci = (README.parent / ".ci" / "run").read_text()
    assert "\nmake test\n" in ci
