"""bench.gpu_scale.crossover pairs two runs' steps by their index in the stream."""

from __future__ import annotations

from typing import Any

import pytest

from bench.gpu_scale import crossover

MS = 1_000_000


def ab_doc(first: str, steps: dict[int, tuple[str, float, int]], fingerprint: str = "f") -> Any:
    """What bench.gpu_scale.ab writes, for steps {index: (mode, step ms, tokens)}
    (scheduler CPU: a tenth of the step)."""
    per_step: dict[str, dict[str, list[int]]] = {
        m: {"index": [], "step_ns": [], "sched_cpu_ns": [], "tokens": []} for m in ("off", "on")
    }
    for i, (mode, ms, tokens) in steps.items():
        rows = per_step[mode]
        rows["index"].append(i)
        rows["step_ns"].append(int(ms * MS))
        rows["sched_cpu_ns"].append(int(ms * MS / 10))
        rows["tokens"].append(tokens)
    return {"first": first, "schedule_fingerprint": fingerprint, "per_step": per_step}


def two_runs() -> tuple[Any, Any]:
    first_off = {0: ("off", 10, 100), 1: ("off", 30, 4000), 2: ("on", 8, 100), 3: ("on", 13, 200)}
    first_on = {0: ("on", 11, 100), 1: ("on", 30, 4000), 2: ("off", 10, 100), 3: ("off", 12, 200)}
    return ab_doc("off", first_off), ab_doc("on", first_on)


def test_each_step_is_paired_with_itself_in_the_other_run() -> None:
    # run 1 measures steps 0-1 off and 2-3 on; run 2 the other way round.  The
    # plugin adds 1 ms to steps 0 and 3, 0 to step 1, and step 2 is 2 ms
    # *shorter* on -- the two runs' spread, which the pairs keep
    tokens = {0: 100, 1: 4000, 2: 100, 3: 200}
    run1, run2 = two_runs()
    doc = crossover.paired(run1, run2)
    assert doc["steps"] == 4
    assert doc["tokens_per_step"] == sum(tokens.values()) / 4
    # the same steps: off 10+30+10+12 = 62 ms, on 11+30+8+13 = 62 ms
    assert doc["throughput_ratio"] == 1.0
    assert doc["added_step"]["mean_ms"] == 0.0
    assert doc["added_step"]["max_ms"] == 1.0
    assert doc["added_step"]["p50_ms"] == 1.0  # (-2, 0, 1, 1): the upper middle
    assert doc["added_sched_cpu"]["max_ms"] == 0.1
    assert doc["step_off"]["max_ms"] == 30.0 and doc["step_on"]["max_ms"] == 30.0


def test_the_blocks_means_would_have_told_another_story() -> None:
    # the same pair of runs, read as the one-process bench reads one run: its
    # off steps against its on steps, other steps in each -- run 1 alone says
    # the plugin made steps *shorter* (off 20 ms, on 10.5 ms a step)
    run1, run2 = two_runs()
    off1 = sum(run1["per_step"]["off"]["step_ns"]) / 2
    on1 = sum(run1["per_step"]["on"]["step_ns"]) / 2
    assert off1 / on1 > 1.9
    assert crossover.paired(run1, run2)["throughput_ratio"] == 1.0


def test_runs_that_scheduled_other_steps_are_not_paired() -> None:
    run1 = ab_doc("off", {0: ("off", 10, 100), 1: ("on", 10, 100)})
    with pytest.raises(crossover.CrossoverError, match="fingerprints"):
        crossover.paired(run1, ab_doc("on", {0: ("on", 10, 100), 1: ("off", 10, 100)}, "g"))
    with pytest.raises(crossover.CrossoverError, match="other tokens"):
        crossover.paired(run1, ab_doc("on", {0: ("on", 10, 100), 1: ("off", 10, 101)}))
    with pytest.raises(crossover.CrossoverError, match="measured off in both"):
        crossover.paired(run1, ab_doc("off", {0: ("off", 10, 100), 1: ("on", 10, 100)}))
    with pytest.raises(crossover.CrossoverError, match="same steps"):
        crossover.paired(run1, ab_doc("on", {0: ("on", 10, 100), 2: ("off", 10, 100)}))


def test_its_own_options_are_refused_where_they_clash(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        crossover.main(["--first", "on"])
    assert exited.value.code == 2
    assert "both --first" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        crossover.main(["--rounds", "3", "--json"])
    assert exited.value.code == 2
    assert "--json: expected one argument" in capsys.readouterr().err


def test_the_crossed_ratio_cancels_the_runs_speeds_and_their_blocks_work() -> None:
    # steps of unequal work (a prefill-heavy stretch falls in run 1's on
    # blocks), run 2's process 20 % slower throughout, the plugin 2 % a step:
    # the runs' own ratios are far from 1/1.02 either way, and the ratio over
    # the same steps a little; the crossed ratio is 1/1.02
    work = {i: 10.0 + (25.0 if i % 4 in (2, 3) and i < 8 else 0.0) for i in range(16)}
    first_mode = {i: "off" if i % 4 < 2 else "on" for i in work}  # ABBA, blocks of 2
    other = {"off": "on", "on": "off"}

    def run(speed: float, modes: dict[int, str], first: str) -> Any:
        return ab_doc(
            first,
            {
                i: (m, work[i] * speed * (1.02 if m == "on" else 1.0), 1000)
                for i, m in modes.items()
            },
        )

    run1 = run(1.0, first_mode, "off")
    run2 = run(1.2, {i: other[m] for i, m in first_mode.items()}, "on")
    doc = crossover.paired(run1, run2)
    assert doc["throughput_ratio_crossed"] == round(1 / 1.02, 4)
    assert abs(doc["throughput_ratio"] - 1 / 1.02) > 0.005
    own = [
        sum(r["per_step"]["off"]["step_ns"]) / sum(r["per_step"]["on"]["step_ns"])
        for r in (run1, run2)
    ]
    assert own[0] < 0.8 and own[1] > 1.1
