"""docker/loadgen/vllm_replay.py, the `vllm` profile's traffic: a Mooncake
trace's hash ids become token-id prompts in which the same hash id is the
same block of ids, so that requests share exactly the prefixes the trace
says; the shipped trace loads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.docker.helpers import DOCKER

REPLAY = DOCKER / "loadgen" / "vllm_replay.py"


@pytest.fixture(scope="module")
def replay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_replay", REPLAY)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_shared_hash_ids_are_shared_token_blocks(replay: ModuleType) -> None:
    a = replay.prompt([0, 1, 2], 32, 10_000)
    b = replay.prompt([0, 1, 7], 32, 10_000)
    assert len(a) == len(b) == 96
    assert a[:64] == b[:64] and a[64:] != b[64:]
    assert all(100 <= t < replay.VOCAB for t in a + b)
    # each block differs from every other block of the trace's first ids
    blocks = {tuple(replay.prompt([h], 32, 32)) for h in range(2000)}
    assert len(blocks) == 2000
    assert replay.prompt([0, 1, 2], 32, 40) == a[:40]


def test_the_shipped_trace_loads(replay: ModuleType, tmp_path: Path) -> None:
    rows = replay.load_trace(DOCKER / "loadgen" / "mooncake_head50.jsonl")
    assert len(rows) == 50 and rows[0]["hash_ids"][:3] == [0, 1, 2]
    assert all(r["output_length"] >= 1 for r in rows)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SystemExit, match="no request"):
        replay.load_trace(empty)
