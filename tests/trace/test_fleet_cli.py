"""``blockpool trace --replicas ...``: fleet planning on the command line."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from app.cli import main
from blockpool.trace.fleet import ROUTERS
from tests.trace.fleet_traces import conversation_trace
from tests.trace.test_fleet_stepfit import scrape

BPT = 131072  # bytes a token: a block of 16 is 2 MiB


@pytest.fixture(scope="module")
def conv_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = conversation_trace()
    p = tmp_path_factory.mktemp("fleet") / "conv.jsonl"
    rows = [
        {"timestamp": r.timestamp_ms, "input_length": r.input_length,
         "output_length": r.output_length, "hash_ids": list(r.hash_ids)}
        for r in t.requests
    ]  # fmt: skip
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["trace", *argv, "--json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_json_answers_every_configuration_and_the_target(
    conv_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_json(capsys, str(conv_file), "--tokens-per-id", "16", "--replicas", "1,2",
                   "--capacity", "48MiB,160MiB", "--bytes-per-token", str(BPT),
                   "--target-hit-rate", "0.4", "--executor", "serial")  # fmt: skip
    results = doc["results"]
    assert isinstance(results, list) and len(results) == 2 * 2 * len(ROUTERS)
    one = [r for r in results if r["replicas"] == 1 and r["capacity"] == "160MiB"]
    # one replica: every router gives the single pool's answer
    assert len({r["hit_tokens"] for r in one}) == 1
    assert one[0]["blocks_per_replica"] == 80 and one[0]["total_bytes"] == 160 << 20
    assert all(r["ttft_ms"] is None for r in results)  # sequence mode: not known
    target = doc["target"]
    assert isinstance(target, dict)
    best = target["smallest"]
    ok = [r for r in results if r["hit_rate"] >= 0.4]
    assert best["total_bytes"] == min(r["total_bytes"] for r in ok)
    assert best["hit_rate"] >= 0.4


def test_the_table_csv_and_processes_agree(
    conv_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["trace", str(conv_file), "--tokens-per-id", "16", "--replicas", "2,4",
            "--capacity-blocks", "40", "--router", "round_robin,prefix_aware"]  # fmt: skip
    assert main([*argv, "--csv", "--executor", "serial"]) == 0
    serial = capsys.readouterr().out
    assert main([*argv, "--csv", "--workers", "2"]) == 0
    assert capsys.readouterr().out == serial
    rows = list(csv.DictReader(io.StringIO(serial)))
    assert [(r["replicas"], r["router"]) for r in rows] == [
        ("2", "round_robin"), ("2", "prefix_aware"), ("4", "round_robin"), ("4", "prefix_aware"),
    ]  # fmt: skip
    assert rows[0]["total_gib"] == ""  # no layout: bytes not known
    assert main([*argv, "--executor", "serial"]) == 0
    table = capsys.readouterr().out
    assert "fleet planning, sequence mode" in table
    assert "prefix_aware" in table and rows[3]["hit_rate"][:6] in table


def test_timed_fleet_with_a_fitted_step_model_and_a_plot(
    conv_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(scrape(20.0, 0.12))
    png = tmp_path / "fleet.png"
    doc = run_json(capsys, str(conv_file), "--tokens-per-id", "16", "--mode", "timed",
                   "--replicas", "1,2", "--capacity", "80MiB,320MiB", "--bytes-per-token",
                   str(BPT), "--router", "round_robin,prefix_aware", "--max-num-batched-tokens",
                   "64", "--max-running", "8", "--step-model-metrics", str(metrics),
                   "--target-ttft-p99", "2000", "--executor", "serial",
                   "--plot", str(png))  # fmt: skip
    model = doc["step_model"]
    assert isinstance(model, dict) and model["per_prefill_token_ms"] == pytest.approx(0.12, rel=0.1)
    results = doc["results"]
    assert isinstance(results, list)
    for r in results:
        assert r["ttft_ms"]["p99"] is not None and r["queue_ms"]["p99"] is not None
    target = doc["target"]
    assert isinstance(target, dict) and target["smallest"] is not None
    assert target["smallest"]["ttft_p99_ms"] <= 2000
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--replicas", "0"], "--replicas: 0 is not in 1..4096"),
        (["--replicas", "2,x"], "--replicas: not an integer: 'x'"),
        (["--replicas", "2", "--router", "random"], "unknown router 'random'"),
        (["--replicas", "2", "--target-ttft-p99", "100"], "--target-ttft-p99 needs --mode timed"),
        (["--replicas", "2", "--ray-address", "auto"], "--ray-address needs --executor ray"),
        (["--replicas", "2", "--free-orders", "lifo"], "--free-orders: unknown 'lifo'"),
        (["--replicas", "2", "--sweep"], "--sweep is for one pool"),
        (["--replicas", "2", "--target-hit-rate", "2"], "--target-hit-rate must be in (0, 1]"),
    ],
)
def test_bad_flags_are_clear_errors(
    conv_file: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["trace", str(conv_file), "--tokens-per-id", "16", *extra]) == 2
    err = capsys.readouterr()
    assert message in err.err and err.out == ""


def test_the_json_assignment_feeds_independent_pools(
    conv_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # what a checker outside the planner does: take each configuration's
    # routed requests from the JSON and replay each replica's on a pool alone
    from blockpool.trace import parse_mooncake
    from blockpool.trace.plan.report import replay_trace

    doc = run_json(capsys, str(conv_file), "--tokens-per-id", "16", "--replicas", "3",
                   "--capacity-blocks", "40", "--assignments", "--executor", "serial")  # fmt: skip
    lines = conv_file.read_text().splitlines()
    results = doc["results"]
    assert isinstance(results, list) and len(results) == len(ROUTERS)
    for res in results:
        assignment = res["assignment"]
        assert len(assignment) == len(lines)
        for j, rep in enumerate(res["per_replica"]):
            mine = [line for line, a in zip(lines, assignment, strict=True) if a == j]
            alone = replay_trace(parse_mooncake(mine, 16), block_size=16,
                                 capacities_tokens=[40 * 16]).results[0]  # fmt: skip
            assert (rep["hit_tokens"], rep["evictions"], rep["prompt_tokens"]) == (
                alone.hit_tokens, alone.evictions, alone.prompt_tokens,
            ), (res["router"], j)  # fmt: skip
    plain = run_json(capsys, str(conv_file), "--tokens-per-id", "16", "--replicas", "2",
                     "--capacity-blocks", "40", "--executor", "serial")  # fmt: skip
    rows = plain["results"]
    assert isinstance(rows, list) and "assignment" not in rows[0]
