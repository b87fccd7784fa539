"""Stream benchmarks (not a test): what watching the pool costs.

1. Pool throughput with 10 connected stream clients vs none (goal >= 0.9x):
   a driver process pushes allocate/free churn through /api/batch as fast as
   it can; runs with 0 and 10 clients alternate; the ratio is taken both by
   wall-clock block-ops/s and by block-ops per second of *server* CPU time
   (the server's own cost, free of the 2-core machine's contention).
2. Op -> client-replica latency with 50 clients and 100k blocks (goal p99 <=
   100 ms): an op is sent every 100 ms; each client notes when its replica
   shows it.
3. Bytes per second per client at ~1,000 block changes/s (goal <= 50 KB/s),
   with a realistic mix (admits with shared prefixes, decode, finish), so
   KV events ride along.

    python bench/bench_stream.py [--quick] [--json bench/results/stream.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.stream.client import StreamClient  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, num_blocks: int, tick_hz: float = 20.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws = f"ws://127.0.0.1:{self.port}/api/stream"
        cmd = [
            sys.executable, "-m", "app.cli", "serve", "--port", str(self.port),
            "--num-blocks", str(num_blocks), "--block-size", "16", "--no-demo",
            "--no-storage", "--tick-hz", str(tick_hz), "--log-level", "warning",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, cwd=ROOT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/api/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# ---------------------------------------------------------------- readers


async def _readers(url: str, n: int, duration: float) -> None:
    """n raw clients that read every frame (compressed frames, as StreamClient)."""

    async def one() -> None:
        async with websockets.connect(url + "?compress=zlib", max_size=None) as ws:
            end = time.monotonic() + duration
            while time.monotonic() < end:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ws.recv(), timeout=1)

    await asyncio.gather(*(one() for _ in range(n)))


def spawn_readers(url: str, n: int, duration: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--readers", str(n), "--url", url, "--duration", str(duration)],
        cwd=ROOT,
    )


# ------------------------------------------------------------- 1. throughput


def churn(url: str, duration: float, batch_blocks: int = 64) -> int:
    """Allocate/free churn through /api/batch; returns block-ops done."""
    ops = 0
    held: list[int] = []
    with httpx.Client(base_url=url, timeout=30) as c:
        end = time.monotonic() + duration
        while time.monotonic() < end:
            body: list[dict[str, Any]] = [{"op": "allocate", "num_blocks": batch_blocks}]
            if held:
                body.insert(0, {"op": "free", "block_ids": held})
            r = c.post("/api/batch", json={"ops": body})
            r.raise_for_status()
            res = r.json()["results"]
            ops += batch_blocks + len(held)
            held = res[-1]["result"]["block_ids"]
    return ops


def bench_throughput(reps: int, duration: float) -> dict[str, Any]:
    srv = Server(20_000)
    try:
        churn(srv.url, 1.0)  # warm-up
        rows: dict[int, list[tuple[float, float]]] = {0: [], 10: []}
        for rep in range(reps):
            order = (0, 10) if rep % 2 == 0 else (10, 0)
            for clients in order:
                readers = spawn_readers(srv.ws, clients, duration + 3) if clients else None
                time.sleep(1.5 if clients else 0.2)
                cpu0, t0 = srv.cpu_seconds(), time.monotonic()
                ops = churn(srv.url, duration)
                dt, dcpu = time.monotonic() - t0, srv.cpu_seconds() - cpu0
                rows[clients].append((ops / dt, ops / max(dcpu, 1e-9)))
                if readers:
                    readers.wait(30)
        wall = [b[0] / a[0] for a, b in zip(rows[0], rows[10], strict=True)]
        cpu = [b[1] / a[1] for a, b in zip(rows[0], rows[10], strict=True)]
        return {
            "ops_per_s_no_clients": statistics.median(r[0] for r in rows[0]),
            "ops_per_s_10_clients": statistics.median(r[0] for r in rows[10]),
            "ratio_wall": statistics.median(wall),
            "ratio_server_cpu": statistics.median(cpu),
            "pairs_wall": wall,
            "pairs_server_cpu": cpu,
        }
    finally:
        srv.stop()


# ---------------------------------------------------------------- 2. latency


async def _latency(srv: Server, n_clients: int, n_ops: int) -> dict[str, Any]:
    # For each client: block id -> when a frame last showed it going in use.
    arrived: list[dict[int, float]] = [{} for _ in range(n_clients)]

    def make_hook(i: int) -> Any:
        def hook(frame: Any) -> None:
            cols = frame.columns
            if "ids" in cols and len(cols["ids"]):
                now = time.monotonic()
                seen = arrived[i]
                for bid in cols["ids"][cols["state"] == 1].tolist():
                    seen[bid] = now

        return hook

    clients = [StreamClient(srv.ws) for _ in range(n_clients)]
    for i, c in enumerate(clients):
        c.on_frame = make_hook(i)
        c.start()
    for c in clients:
        await c.wait_until(lambda m: m.seq is not None, timeout=60)
    latencies: list[float] = []
    slow = 0
    async with httpx.AsyncClient(base_url=srv.url) as h:
        for _ in range(n_ops):
            t0 = time.monotonic()
            r = await h.post("/api/pool/allocate", json={"num_blocks": 1})
            bid = r.json()["block_ids"][0]
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                got = [a.get(bid, 0.0) for a in arrived]
                if all(t >= t0 for t in got):
                    break
                await asyncio.sleep(0.005)
            lat = [t - t0 for t in got if t >= t0]
            slow += n_clients - len(lat)
            latencies.extend(lat)
            await asyncio.sleep(0.1)
            await h.post("/api/pool/free", json={"block_ids": [bid]})
            await asyncio.sleep(0.1)
    for c in clients:
        await c.close()
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    return {
        "clients": n_clients,
        "ops": n_ops,
        "samples": len(latencies),
        "missed_over_5s": slow,
        "p50_ms": 1000 * q[49],
        "p99_ms": 1000 * q[98],
        "max_ms": 1000 * latencies[-1],
    }


def bench_latency(n_clients: int, n_ops: int, num_blocks: int) -> dict[str, Any]:
    srv = Server(num_blocks)
    try:
        return asyncio.run(_latency(srv, n_clients, n_ops))
    finally:
        srv.stop()


# -------------------------------------------------------------- 3. bandwidth


async def _bandwidth(srv: Server, duration: float, n_clients: int) -> dict[str, Any]:
    rng = random.Random(0)
    prefixes = [[rng.randrange(32000) for _ in range(rng.randint(100, 600))] for _ in range(8)]
    changes = 0

    def count(frame: Any) -> None:
        nonlocal changes
        if "ids" in frame.columns:
            changes += len(frame.columns["ids"])

    clients = [StreamClient(srv.ws) for _ in range(n_clients)]
    clients[0].on_frame = count
    for c in clients:
        c.start()
    for c in clients:
        await c.wait_until(lambda m: m.seq is not None, timeout=60)
    bytes0 = [c.bytes for c in clients]
    changes = 0
    running: list[str] = []
    n = 0
    async with httpx.AsyncClient(base_url=srv.url) as h:
        t0 = time.monotonic()
        while time.monotonic() - t0 < duration:
            ops: list[dict[str, Any]] = []
            n += 1
            rid = f"bw-{n}"
            prompt = rng.choice(prefixes) + [
                rng.randrange(32000) for _ in range(rng.randint(50, 200))
            ]
            ops.append({"op": "admit", "request_id": rid, "token_ids": prompt})
            ops.extend(
                {"op": "append", "request_id": old, "token_ids": [1, 2, 3, 4]}
                for old in running[-4:]
            )
            if len(running) >= 8:
                ops.append({"op": "finish", "request_id": running.pop(0)})
            await h.post("/api/batch", json={"ops": ops, "on_error": "continue"})
            running.append(rid)
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - t0
    await asyncio.sleep(0.2)
    per_client = [(c.bytes - b0) / elapsed for c, b0 in zip(clients, bytes0, strict=True)]
    for c in clients:
        await c.close()
    rate = changes / elapsed
    bps = statistics.median(per_client)
    return {
        "block_changes_per_s": rate,
        "bytes_per_s_per_client": bps,
        "bytes_per_s_per_client_at_1000_changes": bps * 1000 / max(rate, 1e-9),
        "note": "websocket payload bytes, frames zlib-compressed once per tick",
    }


def bench_bandwidth(duration: float) -> dict[str, Any]:
    srv = Server(20_000)
    try:
        return asyncio.run(_bandwidth(srv, duration, 3))
    finally:
        srv.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=str(ROOT / "bench/results/stream.json"))
    ap.add_argument("--readers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=float, default=5.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.readers is not None:
        asyncio.run(_readers(args.url, args.readers, args.duration))
        return 0
    quick = args.quick
    out: dict[str, Any] = {}
    out["throughput"] = bench_throughput(reps=2 if quick else 4, duration=3 if quick else 5)
    t = out["throughput"]
    print(
        f"1. throughput  no clients {t['ops_per_s_no_clients']:,.0f} block-ops/s, 10 clients "
        f"{t['ops_per_s_10_clients']:,.0f}: ratio {t['ratio_wall']:.3f} (wall), "
        f"{t['ratio_server_cpu']:.3f} (per server CPU second)   goal >= 0.9"
    )
    out["latency"] = bench_latency(50, 60 if quick else 200, 100_000)
    lat = out["latency"]
    print(
        f"2. latency     50 clients, 100k blocks: p50 {lat['p50_ms']:.1f} ms, p99 "
        f"{lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms ({lat['samples']} samples)   "
        f"goal p99 <= 100 ms"
    )
    out["bandwidth"] = bench_bandwidth(5 if quick else 15)
    bw = out["bandwidth"]
    print(
        f"3. bandwidth   {bw['block_changes_per_s']:,.0f} block changes/s: "
        f"{bw['bytes_per_s_per_client'] / 1024:.1f} KiB/s per client "
        f"(= {bw['bytes_per_s_per_client_at_1000_changes'] / 1024:.1f} KiB/s at 1,000/s)   "
        f"goal <= 50 KB/s"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
