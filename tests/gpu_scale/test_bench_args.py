"""The GPU-scale benches refuse values that would measure something else
than asked, before they start anything: a negative per-token time (passes
shorter than ``--sleep-ms``), a NaN or negative sleep, no steps or rounds, a
pace of 0 steps a second.  What they accept arrives as given."""

from __future__ import annotations

import argparse

import pytest

from bench.gpu_scale import ab, forked, run


def refuses(
    parser: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--forward-us-per-token", "-0.5"],
            "--forward-us-per-token: must be a number of 0 or more",
        ),
        (["--sleep-ms", "nan"], "--sleep-ms: must be a number of 0 or more"),
        (["--sleep-ms", "inf"], "--sleep-ms: must be a number of 0 or more"),
        (["--warmup-sleep-ms", "-1"], "--warmup-sleep-ms: must be a number of 0 or more"),
        (["--steps", "0"], "--steps: must be above 0"),
        (["--steps", "ten"], "--steps: must be a whole number"),
        (["--num-blocks", "-8"], "--num-blocks: must be above 0"),
        (["--rounds", "0"], "--rounds: must be above 0"),
        (["--steps-per-s", "0"], "--steps-per-s: must be above 0"),
        (["--duration", "-3"], "--duration: must be a number of 0 or more"),
    ],
)
def test_run_refuses(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert says in refuses(run.parser(), argv, capsys)


def test_run_takes_what_it_is_given() -> None:
    args = run.parser().parse_args(
        ["--forward-us-per-token", "0.5", "--sleep-ms", "0", "--steps", "7", "--steps-per-s", "150"]
    )
    assert (args.forward_us_per_token, args.sleep_ms, args.steps, args.steps_per_s) == (
        0.5,
        0.0,
        7,
        150.0,
    )


def test_one_process_benches_refuse(capsys: pytest.CaptureFixture[str]) -> None:
    for parser in (ab.parser(), forked.parser()):
        assert "--num-blocks: must be above 0" in refuses(parser, ["--num-blocks", "0"], capsys)
    assert "--rounds: must be above 0" in refuses(ab.parser(), ["--rounds", "0"], capsys)
    assert "--sleep-ms: must be a number" in refuses(ab.parser(), ["--sleep-ms", "-6"], capsys)
    assert "--reps: must be above 0" in refuses(forked.parser(), ["--reps", "0"], capsys)
    assert ab.parser().parse_args(["--rounds", "3"]).rounds == 3
    assert forked.parser().parse_args(["--reps", "2"]).reps == 2
