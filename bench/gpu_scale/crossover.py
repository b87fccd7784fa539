"""The one-process bench run twice, crossed over: every step measured in both modes.

``bench.gpu_scale.ab`` alternates blocks of *different* steps between the
plugin on and off.  The request stream is seeded and the plugin changes no
decision of vLLM's, so a run schedules the same steps whatever it measures
(the schedule's fingerprint) -- but the steps of the on blocks are not those
of the off blocks: a run of 30 rounds scheduled 2,408 tokens a step in its
off blocks and 2,575 in its on blocks (the Intel VM, 2026-12-07), and a
mean step is as long as its tokens make it.  Its ratio carries that.

This runs it twice, as two processes with the same options: one whose first
block is off, one whose first block is on.  Each step of the stream is then
measured once with the plugin off (in one run) and once with it on (in the
other), and the two are paired by the step's index:

* the throughput ratio over the same steps (their time off over their time
  on, summed);
* the time the plugin added to each step: p50, p99, max and mean of (on -
  off) for the same step.  A pair's two times come from two processes, so
  a difference also holds theirs (heaps laid out apart, the machine's other
  work): with ``--aa`` both runs keep the plugin off, and what is left is
  that spread.

The headline ratio is the geometric mean of the two runs' own ratios
(``throughput_ratio_crossed``).  Say a run's steps take ``s`` times what
they would in another process (its heap, the VM's neighbours: two runs of
the same code here differed by 12 % in their mean step), its off blocks'
steps hold ``A`` of work and its on blocks' ``B``, and the plugin makes a
step ``f`` times as long: the first run reads ``sA / (sBf)``, the second
``s'B / (s'Af)``, and their product is ``1/f²`` -- the speeds and the
work cancel.  The ratio over the same steps (``throughput_ratio``) keeps a
little of both, ``(s' - s)(B - A)``.

Each run's own table is printed as it ends; the runs must agree on the
schedule (else this stops: the pairs would not be the same steps).

    python -m bench.gpu_scale.crossover [AB OPTIONS: --async --rounds 30 ...] [--aa] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.gpu_scale.report import summarize


class CrossoverError(RuntimeError):
    """The two runs did not schedule the same steps."""


def paired(first_off: dict[str, Any], first_on: dict[str, Any]) -> dict[str, Any]:
    """The steps of two runs of ``bench.gpu_scale.ab`` (``--first off`` and
    ``--first on``), each step's time off and on side by side."""
    if first_off["schedule_fingerprint"] != first_on["schedule_fingerprint"]:
        raise CrossoverError(
            "the two runs scheduled different steps (fingerprints "
            f"{first_off['schedule_fingerprint']} and {first_on['schedule_fingerprint']})"
        )
    times: dict[str, dict[int, tuple[int, int, int]]] = {"off": {}, "on": {}}
    for doc in (first_off, first_on):
        for mode, rows in doc["per_step"].items():
            for i, step, cpu, tokens in zip(
                rows["index"], rows["step_ns"], rows["sched_cpu_ns"], rows["tokens"], strict=True
            ):
                if i in times[mode]:
                    raise CrossoverError(f"step {i} was measured {mode} in both runs")
                times[mode][i] = (step, cpu, tokens)
    if times["off"].keys() != times["on"].keys():
        raise CrossoverError("the runs did not measure the same steps")
    steps = sorted(times["off"])
    off = [times["off"][i] for i in steps]
    on = [times["on"][i] for i in steps]
    if any(a[2] != b[2] for a, b in zip(off, on, strict=True)):
        raise CrossoverError("a step scheduled other tokens in the other run")
    step_off = sum(a[0] for a in off)
    step_on = sum(b[0] for b in on)
    own = [_own_ratio(doc) for doc in (first_off, first_on)]
    return {
        "throughput_ratio_crossed": round(math.sqrt(own[0] * own[1]), 4),
        "steps": len(steps),
        "tokens_per_step": round(statistics.fmean(a[2] for a in off), 1) if off else 0.0,
        "step_off": summarize([a[0] for a in off]),
        "step_on": summarize([b[0] for b in on]),
        "added_step": summarize([b[0] - a[0] for a, b in zip(off, on, strict=True)]),
        "added_sched_cpu": summarize([b[1] - a[1] for a, b in zip(off, on, strict=True)]),
        "throughput_ratio": round(step_off / step_on, 4) if step_on else 0.0,
    }


def _own_ratio(doc: dict[str, Any]) -> float:
    """A run's mean step off over its mean step on (ab.py's throughput ratio)."""
    off, on = (doc["per_step"][m]["step_ns"] for m in ("off", "on"))
    return statistics.fmean(off) / statistics.fmean(on) if off and on else 0.0


def run(ab_argv: list[str]) -> dict[str, Any]:
    """Both runs (each its own process, its table printed), then the pairs."""
    docs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-scale-crossover-") as tmp:
        for first in ("off", "on"):
            out = Path(tmp) / f"first-{first}.json"
            cmd = [sys.executable, "-m", "bench.gpu_scale.ab", *ab_argv]
            subprocess.run([*cmd, "--first", first, "--json", str(out)], check=True)
            docs[first] = json.loads(out.read_text())
    doc = paired(docs["off"], docs["on"])
    head = docs["off"]
    doc.update(
        bench="gpu_scale_crossover",
        scheduler=head["scheduler"],
        num_blocks=head["num_blocks"],
        rounds=head["rounds"],
        block=head["block"],
        sleep_ms=head["sleep_ms"],
        aa=head["aa"],
        runs={
            first: {
                "throughput_ratio": d["throughput_ratio"],
                "digests_taken": d["digests_taken"],
                "digest_check": d["digest_check"],
            }
            for first, d in docs.items()
        },
    )
    return doc


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['scheduler']}  {doc['num_blocks']:,} blocks  two runs of {doc['rounds']} rounds x "
        f"{doc['block']} steps, crossed over  sleep {doc['sleep_ms']} ms"
        + ("  A/A: the plugin off in both runs" if doc["aa"] else ""),
        f"steps paired {doc['steps']} (each off in one run, on in the other), "
        f"{doc['tokens_per_step']} tokens a step",
        f"{'per step (ms)':<26}{'p50':>9}{'p99':>9}{'max':>9}{'mean':>9}",
    ]
    for label, key in (
        ("step off", "step_off"),
        ("step on", "step_on"),
        ("added, same step", "added_step"),
        ("added scheduler CPU", "added_sched_cpu"),
    ):
        q = doc[key]
        lines.append(
            f"{label:<26}{q['p50_ms']:>9.3f}{q['p99_ms']:>9.3f}{q['max_ms']:>9.3f}{q['mean_ms']:>9.3f}"
        )
    lines.append(
        f"throughput ratio, crossed (the runs' own, their geometric mean): "
        f"{doc['throughput_ratio_crossed']:.3f}x"
    )
    lines.append(f"throughput ratio over the same steps (off/on): {doc['throughput_ratio']:.3f}x")
    for first, r in doc["runs"].items():
        lines.append(
            f"run first {first}: its own ratio {r['throughput_ratio']:.3f}x, digests "
            f"{r['digests_taken']}, digest against vLLM's pool: {r['digest_check']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [AB OPTIONS] [--json PATH]",
        allow_abbrev=False,
    )
    p.add_argument("--json", type=Path, help="the pairs' document (each run's own is not kept)")
    args, ab_argv = p.parse_known_args(argv)
    if "--first" in ab_argv:
        p.error("it runs both --first itself")
    doc = run(ab_argv)
    sys.stdout.write(table(doc) + "\n")
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
