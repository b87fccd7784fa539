#!/usr/bin/env python3
"""bench_rest.py -- what does the REST layer cost?

Starts the service as a real process (``python -m app.cli serve``, no demo)
and drives it with concurrent HTTP clients -- wrk when it is installed
(``apt-get install -y wrk``), otherwise asyncio + httpx in worker processes
(which on a small machine may be the bottleneck; the table says which ran).

Phases, interleaved over --reps rounds so that drift hits all of them alike:

* ``health``     GET /api/health: a no-op endpoint of the same server (baseline).
* ``alloc_free`` POST /api/pool/allocate {"num_blocks": 1}, then POST
                 /api/pool/free with the id it returned: a real pool round
                 trip through the engine's queue.  Goal: >= 0.7 x health req/s.
* ``batch``      POST /api/batch with --batch-pairs x (free 64 ids held from the
                 previous batch, allocate 64).  Block-ops/s is measured on the
                 server (blocks_allocated + blocks_freed from /api/summary over
                 the phase).  Goal: >= 100,000 block-ops/s.

Prints a table and writes JSON (--json, default bench/results/rest.json).
Not a test: pytest never collects bench/.

    python bench/bench_rest.py [--duration 5] [--reps 3] [--connections 16] [--client auto]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from output import write_json

ROOT = Path(__file__).resolve().parent.parent
BLOCKS_PER_OP = 64

ALLOC_FREE_LUA = r"""
local held = {}
request = function()
  if #held > 0 then
    local id = table.remove(held)
    return wrk.format("POST", "/api/pool/free", {["Content-Type"]="application/json"},
                      '{"block_ids":[' .. id .. ']}')
  end
  return wrk.format("POST", "/api/pool/allocate", {["Content-Type"]="application/json"},
                    '{"num_blocks":1}')
end
response = function(status, headers, body)
  local id = string.match(body, '"block_ids":%[(%d+)%]')
  if id then table.insert(held, id) end
end
"""

BATCH_LUA = r"""
local held = {}
local pairs_per_batch = %(pairs)d
request = function()
  local ops = {}
  for k = 1, pairs_per_batch do
    if #held > 0 then
      table.insert(ops, '{"op":"free","block_ids":[' .. table.remove(held) .. ']}')
    end
    table.insert(ops, '{"op":"allocate","num_blocks":%(n)d}')
  end
  return wrk.format("POST", "/api/batch", {["Content-Type"]="application/json"},
                    '{"ops":[' .. table.concat(ops, ",") .. '],"on_error":"continue"}')
end
response = function(status, headers, body)
  for ids in string.gmatch(body, '"block_ids":%%[([%%d,]+)%%]') do
    table.insert(held, ids)
  end
end
"""


# ---------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin(cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] if cpus and shutil.which("taskset") else []


class Server:
    def __init__(self, num_blocks: int, cpus: str | None, storage: bool) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKPOOL_")}
        cmd = [
            *pin(cpus), sys.executable, "-m", "app.cli", "serve", "--port", str(self.port),
            "--num-blocks", str(num_blocks), "--no-demo", "--log-level", "warning",
            "--storage" if storage else "--no-storage",
        ]  # fmt: skip
        # the server's log goes to a file: a pipe nobody reads could fill and stall it
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"server exited:\n{self.log.read()}")
            try:
                if get_json(self.url + "/api/health")["status"] == "ok":
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("server did not start")
            time.sleep(0.1)

    def summary(self) -> dict[str, Any]:
        return get_json(self.url + "/api/summary")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def get_json(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


# ---------------------------------------------------------------- clients


def run_wrk(
    url: str, path: str, script: str | None, duration: float, conns: int, cpus: str | None
) -> dict[str, float]:
    cmd = [*pin(cpus), "wrk", "-t1", f"-c{conns}", f"-d{max(1, round(duration))}s", "--latency"]
    tmp = None
    if script is not None:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)  # noqa: SIM115
        tmp.write(script)
        tmp.close()
        cmd += ["-s", tmp.name]
    cmd.append(url + path)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    return {
        "requests": total,
        "rps": rps,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "p50_ms": _ms(p50),
        "p99_ms": _ms(p99),
    }


def _ms(m: re.Match[str] | None) -> float:
    if m is None:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


async def _httpx_worker(url: str, kind: str, duration: float, conns: int, pairs: int) -> list[int]:
    import httpx

    done = [0, 0]  # requests, non-2xx
    stop_at = 0.0  # set once the client is up (imports and start-up do not count)

    async def one(client: httpx.AsyncClient) -> None:
        held: list[list[int]] = []
        while time.monotonic() < stop_at:
            if kind == "health":
                r = await client.get("/api/health")
            elif kind == "alloc_free":
                if held:
                    r = await client.post("/api/pool/free", json={"block_ids": held.pop()})
                else:
                    r = await client.post("/api/pool/allocate", json={"num_blocks": 1})
                    if r.status_code == 200:
                        held.append(r.json()["block_ids"])
            else:
                ops: list[dict[str, Any]] = []
                for _ in range(pairs):
                    if held:
                        ops.append({"op": "free", "block_ids": held.pop()})
                    ops.append({"op": "allocate", "num_blocks": BLOCKS_PER_OP})
                r = await client.post("/api/batch", json={"ops": ops, "on_error": "continue"})
                for res in r.json().get("results", []):
                    ids = res.get("result", {}).get("block_ids")
                    if ids:
                        held.append(ids)
            done[0] += 1
            done[1] += r.status_code >= 300

    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        stop_at = time.monotonic() + duration
        await asyncio.gather(*[one(client) for _ in range(conns)])
    return done


def _httpx_proc(args: tuple[str, str, float, int, int], q: Any) -> None:
    q.put(asyncio.run(_httpx_worker(*args)))


def run_httpx(
    url: str, kind: str, duration: float, conns: int, pairs: int, procs: int
) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per = max(1, conns // procs)
    ps = [
        ctx.Process(target=_httpx_proc, args=((url, kind, duration, per, pairs), q))
        for _ in range(procs)
    ]
    for p in ps:
        p.start()
    results = [q.get() for _ in ps]
    for p in ps:
        p.join()
    total = sum(r[0] for r in results)
    return {
        "requests": total,
        "rps": total / duration,  # each worker counts over its own window of `duration`
        "non_2xx": sum(r[1] for r in results),
        "p50_ms": float("nan"),
        "p99_ms": float("nan"),
    }


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per phase run")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--batch-pairs", type=int, default=16, help="(free 64, allocate 64) per batch")
    ap.add_argument("--num-blocks", type=int, default=200_000)
    ap.add_argument(
        "--storage",
        action="store_true",
        help="K/V storage on (off by default: these phases never write K/V, and 200k "
        "blocks of storage take ~1.6 GB)",
    )
    ap.add_argument("--client", choices=["auto", "wrk", "httpx"], default="auto")
    ap.add_argument("--client-procs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--no-pin", action="store_true", help="do not pin server/client to CPUs")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "rest.json")
    args = ap.parse_args()

    client = args.client
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "httpx"
    if client == "wrk" and not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (apt-get install -y wrk), or use --client httpx")
    ncpu = os.cpu_count() or 1
    pin_ok = not args.no_pin and ncpu >= 2 and shutil.which("taskset") is not None
    server_cpus = "0" if pin_ok else None
    client_cpus = f"1-{ncpu - 1}" if pin_ok else None

    server = Server(args.num_blocks, server_cpus, args.storage)
    runs: dict[str, list[dict[str, float]]] = {"health": [], "alloc_free": [], "batch": []}
    try:
        for _rep in range(args.reps):
            for kind in ("health", "alloc_free", "batch"):
                before = server.summary()["counters"]
                t0 = time.monotonic()
                if client == "wrk":
                    script = {
                        "health": None,
                        "alloc_free": ALLOC_FREE_LUA,
                        "batch": BATCH_LUA % {"pairs": args.batch_pairs, "n": BLOCKS_PER_OP},
                    }[kind]
                    path = "/api/health" if kind == "health" else ""
                    res = run_wrk(
                        server.url, path, script, args.duration, args.connections, client_cpus
                    )
                else:
                    res = run_httpx(
                        server.url, kind, args.duration, args.connections, args.batch_pairs,
                        args.client_procs,
                    )  # fmt: skip
                elapsed = time.monotonic() - t0
                after = server.summary()["counters"]
                moved = (after["blocks_allocated"] - before["blocks_allocated"]) + (
                    after["blocks_freed"] - before["blocks_freed"]
                )
                res["block_ops"] = moved
                res["block_ops_per_s"] = moved / min(elapsed, args.duration + 0.5)
                runs[kind].append(res)
                rps, ops = res["rps"], res["block_ops_per_s"]
                print(f"  {kind:<10} rps {rps:>9.0f}  block-ops/s {ops:>10.0f}", flush=True)
        final = server.summary()
    finally:
        server.stop()

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    ratios = [a["rps"] / h["rps"] for a, h in zip(runs["alloc_free"], runs["health"], strict=True)]
    ratio = statistics.median(ratios)
    batch_ops = med("batch", "block_ops_per_s")
    batch_rps = med("batch", "rps")
    ops_per_batch = 2 * args.batch_pairs
    errors = sum(r["non_2xx"] for rs in runs.values() for r in rs)

    print()
    print(f"REST benchmark: client {client}, {args.connections} connections, "
          f"{args.reps} x {args.duration:g}s per phase, pool {args.num_blocks} blocks"
          f"{' with K/V storage' if args.storage else ''}"
          f"{', server pinned to CPU 0' if pin_ok else ''}")  # fmt: skip
    head = ("phase", "req/s (median)", "best", "p50 ms", "p99 ms", "block-ops/s")
    print(f"{head[0]:<12}{head[1]:>16}{head[2]:>10}{head[3]:>9}{head[4]:>9}{head[5]:>14}")
    for kind in runs:
        print(
            f"{kind:<12}{med(kind, 'rps'):>16,.0f}{max(r['rps'] for r in runs[kind]):>10,.0f}"
            f"{med(kind, 'p50_ms'):>9.2f}{med(kind, 'p99_ms'):>9.2f}"
            f"{med(kind, 'block_ops_per_s'):>14,.0f}"
        )
    print()
    verdict_ratio = "ok" if ratio >= 0.7 else "BELOW GOAL"
    verdict_ops = "ok" if batch_ops >= 100_000 else "BELOW GOAL"
    per_round = ", ".join(f"{r:.2f}" for r in ratios)
    print(
        f"alloc+free vs health: {ratio:.2f}x (per round: {per_round}) goal >= 0.70: {verdict_ratio}"
    )
    print(
        f"batch: {batch_ops:,.0f} block-ops/s ({batch_rps:,.0f} batches/s of {ops_per_batch} ops"
        f" x {BLOCKS_PER_OP} blocks) goal >= 100,000: {verdict_ops}"
    )
    print(f"non-2xx responses: {errors}; blocks held at the end: {final['blocks']['in_use']} "
          "(in flight when the clients stopped)")  # fmt: skip

    out = {
        "benchmark": "rest",
        "client": client,
        "connections": args.connections,
        "duration_s": args.duration,
        "reps": args.reps,
        "num_blocks": args.num_blocks,
        "storage": args.storage,
        "batch": {"pairs": args.batch_pairs, "blocks_per_op": BLOCKS_PER_OP},
        "pinned": pin_ok,
        "machine": {
            "python": platform.python_version(),
            "cpus": ncpu,
            "platform": platform.platform(),
        },
        "runs": runs,
        "summary": {
            "health_rps": med("health", "rps"),
            "alloc_free_rps": med("alloc_free", "rps"),
            "alloc_free_round_trips_per_s": med("alloc_free", "rps") / 2,
            "alloc_free_vs_health": ratio,
            "batch_block_ops_per_s": batch_ops,
            "batch_requests_per_s": batch_rps,
            "non_2xx": errors,
            "goals": {"alloc_free_vs_health": 0.7, "batch_block_ops_per_s": 100_000},
            "met": {"ratio": ratio >= 0.7, "batch": batch_ops >= 100_000},
        },
    }
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
