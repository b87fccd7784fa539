"""The soak (slow set): ``blockpool serve`` running the demo at its top rate
with 5 stream clients for 5 minutes -- memory levels off below the ceiling
its settings give (docs/sizing.md).

The bounded logs are set small here so that they fill within the run even on
a loaded machine; the test waits (as a condition, with a deadline) until the
server itself reports them full -- the event log and the eviction-sample log
dropping entries, the recording dropping operations -- and from then on the
process tree's resident memory must stay flat: any growth left is a missing
bound.  Not a timing assertion: how fast the demo runs only changes how soon
the logs fill."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app import soak

SECONDS = 290.0  # + start-up and the clients: the test stays under 5.5 minutes
MIB = soak.MIB
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "soak"

# Small bounds: each fills within a minute or two at whatever rate the demo gets.
SETTINGS = {
    "num_blocks": "1024",  # evictions (hence samples) from the first seconds
    "event_log_capacity": "3000",
    "sample_log_capacity": "100",
    "metrics_sample_rate": "0.05",
    "recording_max_ops": "2000",
    "recording_keyframe_ops": "250",
    "miss_index_size": "2000",
    "miss_finished_kept": "100",
}


def ceiling(base: int, settings: dict[str, str]) -> int:
    """The most the tree may hold: what it held at start (the interpreters,
    libraries, the pools) plus what each bound can add (docs/sizing.md's
    per-entry costs, 1.5x for the allocator's slack)."""
    s = {k: int(float(v)) for k, v in settings.items() if k != "metrics_sample_rate"}
    keyframe = s["num_blocks"] * soak.COST["keyframe_per_block"]
    logs = (
        s["event_log_capacity"] * soak.COST["event_log_entry"]
        + s["sample_log_capacity"] * soak.COST["sample_log_entry"]
        + s["recording_max_ops"] * soak.COST["recording_op"]
        + (s["recording_max_ops"] // s["recording_keyframe_ops"] + 2) * keyframe
        + s["miss_index_size"] * soak.COST["miss_index_entry"]
    )
    fixed = soak.COST["series"] + soak.COST["stream_ring"]
    return int(base + 1.5 * (logs + fixed))


def full(h: httpx.Client) -> dict[str, Any]:
    summary = h.get("/api/summary").json()
    history = h.get("/api/history").json()
    samples = h.get("/api/samples", params={"since": 0, "limit": 1})
    return {
        "event_log": summary["event_log"]["dropped"] > 0,
        "recording": history["dropped_ops"] > 0,
        "samples": samples.json()["dropped_total"] > 0,
    }


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_memory_levels_off_under_the_settings_ceiling() -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "server.log"
    filled_at: list[float] = []

    def on_sample(h: httpx.Client, t: float) -> None:
        if not filled_at and all(full(h).values()):
            filled_at.append(t)

    r = asyncio.run(soak.soak(SECONDS, SETTINGS, clients=5, log=log, on_sample=on_sample))
    lines = [f"{s.t:6.0f} s  {s.rss / MIB:8.1f} MiB  ops {s.ops:,.0f}" for s in r.samples]
    (ARTIFACTS / "rss.txt").write_text("\n".join(lines) + "\n")
    assert all(n > 0 for n in r.frames), f"every stream client got frames: {r.frames}"
    assert r.final["health"]["status"] == "ok"
    assert filled_at, f"the bounded logs never filled: {lines[-3:]}"
    # the last part: from when every log was full (at most the last 40 %) to the end
    start = max(filled_at[0], 0.6 * r.samples[-1].t)
    tail = [s for s in r.samples if s.t >= start]
    assert len(tail) >= 3 and tail[-1].ops > tail[0].ops, "the demo kept running"
    base = r.samples[0].rss
    top = ceiling(base, SETTINGS)
    grown = max(s.rss for s in tail) - tail[0].rss
    assert r.peak() <= top, f"peak {r.peak() / MIB:.0f} MiB over the ceiling {top / MIB:.0f}"
    # levelled off: what the last part added is a small part of the ceiling
    assert grown <= 0.04 * top, (
        f"RSS still grew {grown / MIB:.1f} MiB after the logs were full "
        f"(ceiling {top / MIB:.0f} MiB): a missing bound?\n" + "\n".join(lines)
    )
    print("\n".join(lines), f"\nceiling {top / MIB:.0f} MiB, filled at {filled_at[0]:.0f} s")  # noqa: T201 the soak's report
