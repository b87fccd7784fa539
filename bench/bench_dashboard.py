"""Dashboard frame rate with big pools under a steady load (not a test).

    .venv/bin/python bench/bench_dashboard.py [--sizes 100000 1000000]
        [--changes 1000] [--seconds 10] [--out bench/results/dashboard.json]

For each pool size: start the server (``python -m app.cli serve``, no demo),
drive a steady churn of about ``--changes`` block changes per second from a
background thread (every 100 ms: allocate k blocks, cache them under fresh
chained hashes, free the k blocks allocated a few rounds before -- so blocks
go in use, cached-evictable and back, and the hash map, the prefix tree and
the event log all move), open the dashboard in headless Chromium and count,
over ``--seconds``:

* requestAnimationFrame callbacks per second (the page's frame rate);
* the block map's own draws: how many, mean / max milliseconds;
* the block changes the page applied from the stream per second.

Headless Chromium runs with --disable-gpu: everything is software-rendered,
on the same CPUs as the server and the load driver.  Prints a table and
writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.chromium import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.e2e import hooks  # noqa: E402

TICK_S = 0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, num_blocks: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
    cmd += ["--num-blocks", str(num_blocks), "--no-demo", "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKPOOL_")}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                return proc
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not come up")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Churn(threading.Thread):
    """~`changes` block changes per second: allocate + cache k, free k older."""

    def __init__(self, base: str, changes: int) -> None:
        super().__init__(daemon=True)
        self.base = base
        # each block changes three times: allocated, cached (hash set), freed
        self.k = max(1, round(changes * TICK_S / 3))
        self.stop_event = threading.Event()
        self.rounds = 0
        self.errors = 0
        self.held: list[list[int]] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as http:
            nxt = time.monotonic()
            while not self.stop_event.is_set():
                try:
                    self.round(http)
                except httpx.HTTPError:
                    self.errors += 1
                nxt += TICK_S
                time.sleep(max(0.0, nxt - time.monotonic()))

    def round(self, http: httpx.Client) -> None:
        ids = http.post("/api/pool/allocate", json={"num_blocks": self.k}).json()["block_ids"]
        hashes = [secrets.token_hex(32) for _ in ids]
        ops: list[dict[str, Any]] = [{"op": "cache", "block_ids": ids, "block_hashes": hashes}]
        self.held.append(ids)
        if len(self.held) > 5:
            old = self.held.pop(0)
            ops.append({"op": "free", "block_ids": old[::-1]})
        r = http.post("/api/batch", json={"ops": ops, "on_error": "continue"})
        if r.status_code != 200 or r.json().get("failed"):
            self.errors += 1
        self.rounds += 1


PERF_JS = """() => {
  const p = window.__bp.perf, m = window.__bp.model;
  return {raf: p.raf, frameMs: p.frameMs, maxFrameMs: p.maxFrameMs, longFrames: p.longFrames,
          draws: p.map.draws, drawMs: p.map.drawMs, maxDrawMs: p.map.maxMs, cells: p.map.cells,
          changed: m.changedTotal, deltas: m.deltas, seq: m.seq, n: m.n,
          scale: window.__bp.map.scale, k: window.__bp.map.k,
          frames: window.__bp.conn.health.frames, bytes: window.__bp.conn.health.bytes,
          resyncs: window.__bp.conn.health.resyncs, gaps: window.__bp.conn.health.gapsResumed};
}"""


def measure(size: int, changes: int, seconds: float, viewport: tuple[int, int]) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    t_server = time.time()
    proc = start_server(port, size)
    server_start_s = time.time() - t_server
    churn = Churn(base, changes)
    try:
        churn.start()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            hooks.install(page)  # window.__bp
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            t0 = time.time()
            page.goto(base + "/")
            page.wait_for_function("() => window.__bp && window.__bp.ready()", timeout=180_000)
            load_s = time.time() - t0
            time.sleep(3)  # let the first panels and charts settle
            page.evaluate("() => window.__bp.resetPerf()")
            a = page.evaluate(PERF_JS)
            t1 = time.perf_counter()
            time.sleep(seconds)
            b = page.evaluate(PERF_JS)
            dt = time.perf_counter() - t1
            summary = httpx.get(base + "/api/summary", timeout=10).json()
            shot = REPO / "test-artifacts" / "bench" / f"dashboard-{size}.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot))
            browser.close()
    finally:
        churn.stop_event.set()
        churn.join(5)
        stop_server(proc)
    draws = b["draws"] - a["draws"]
    return {
        "num_blocks": size,
        "seconds": round(dt, 2),
        "fps": round((b["raf"] - a["raf"]) / dt, 1),
        "map_draws_per_s": round(draws / dt, 1),
        "map_draw_ms_mean": round((b["drawMs"] - a["drawMs"]) / max(1, draws), 3),
        "map_draw_ms_max": round(b["maxDrawMs"], 2),
        "frame_ms_mean": round((b["frameMs"] - a["frameMs"]) / max(1, b["raf"] - a["raf"]), 3),
        "frame_ms_max": round(b["maxFrameMs"], 1),
        "long_frames_over_50ms": b["longFrames"],
        "block_changes_per_s": round((b["changed"] - a["changed"]) / dt, 1),
        "cells_drawn_per_s": round((b["cells"] - a["cells"]) / dt, 1),
        "stream_frames_per_s": round((b["frames"] - a["frames"]) / dt, 1),
        "stream_kb_per_s": round((b["bytes"] - a["bytes"]) / dt / 1024, 1),
        "resyncs": b["resyncs"],
        "gaps_resumed": b["gaps"],
        "map_scale": round(b["scale"], 3),
        "cell_px": b["k"],
        "page_load_to_first_draw_s": round(load_s, 2),
        "server_start_s": round(server_start_s, 2),
        "driver_rounds": churn.rounds,
        "driver_errors": churn.errors,
        "pool": summary["blocks"],
        "page_errors": errors[:5],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--changes", type=int, default=1000, help="block changes per second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--viewport", default="1600x1000")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "dashboard.json"))
    args = ap.parse_args(argv)
    vw, vh = (int(x) for x in args.viewport.split("x"))
    results = []
    for size in args.sizes:
        print(f"… {size:,} blocks, ~{args.changes:,} changes/s, {args.seconds:.0f} s", flush=True)
        results.append(measure(size, args.changes, args.seconds, (vw, vh)))
    cols = [
        ("blocks", "num_blocks", "{:,}"),
        ("fps", "fps", "{:.1f}"),
        ("draws/s", "map_draws_per_s", "{:.1f}"),
        ("draw ms", "map_draw_ms_mean", "{:.2f}"),
        ("draw max", "map_draw_ms_max", "{:.1f}"),
        ("frame ms", "frame_ms_mean", "{:.2f}"),
        ("frame max", "frame_ms_max", "{:.1f}"),
        ("changes/s", "block_changes_per_s", "{:,.0f}"),
        ("load s", "page_load_to_first_draw_s", "{:.1f}"),
    ]
    print()
    print("  ".join(f"{c[0]:>10}" for c in cols))
    for r in results:
        print("  ".join(f"{c[2].format(r[c[1]]):>10}" for c in cols))
    doc = {
        "bench": "dashboard",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "browser": f"{CHROMIUM} {' '.join(CHROMIUM_ARGS)} (software rendering)",
        "viewport": args.viewport,
        "changes_target_per_s": args.changes,
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
