"""Does ``blockpool serve --mirror`` keep up with a GPU engine?

A synthetic GPU-like engine, without vLLM: blockpool's own ``BlockPool`` and
``RequestManager`` (131,072 blocks of 16 tokens by default), followed by the
real ``PoolFollower`` (a digest on every batch, as the plugin sends) and
published by the real ``blockpool_vllm.sender.Sender``.  256 requests run,
each decoding one token a step (so a step allocates and caches about 16
blocks), and as each finishes a new one arrives: a prompt of 1-8k tokens,
most of it a prefix shared with others, so the pool fills, hits and evicts.
Each request's arrival, first scheduling and finish are told as the plugin
tells them (its block hashes travel with the arrival).

The engine's steps are computed once, before anything starts (the batches
kept in memory), then replayed through the sender at ``--steps-per-s``, each
batch stamped with the time it is offered: the engine side costs an offer
per step, so the figure is the mirror's, not this script's.  The mirror
joins from a snapshot of the empty pool before the replay starts (the
sender's control socket answers it); a resync later in the run would get
that same old snapshot and show as gaps (the run is then not exact).

``GET /api/mirror`` is read during the run (the backlog: batches offered
less batches applied; the lag of the newest batch; lag p99 over the last
2000 batches, read every few seconds) and once the mirror has drained.

    python bench/bench_mirror_rate.py [--steps-per-s 200] [--duration 30]
        [--running 256] [--num-blocks 131072] [--serve-arg=--no-analysis ...]

Uses only ``Sender(endpoint, hello, capture, stats)``, ``offer`` and
``close``, and the service's CLI and ``GET /api/mirror``.  Prints one JSON
object (``--out`` also writes it to a file).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from blockpool.core.hashing import get_hash_fn_by_name, init_none_hash  # noqa: E402
from blockpool.core.manager import RequestManager  # noqa: E402
from blockpool.core.pool import BlockPool  # noqa: E402
from blockpool.mirror import protocol as wire  # noqa: E402
from blockpool_vllm.follower import PoolFollower  # noqa: E402
from blockpool_vllm.sender import Sender  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

BLOCK = 16


class Workload:
    """The engine: requests decoding on a followed pool, one batch a step."""

    def __init__(self, args: argparse.Namespace) -> None:
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self.pool = BlockPool(args.num_blocks, True, BLOCK, free_order="append_all")
        self.rm = RequestManager(self.pool, BLOCK, hash_fn=hash_fn)
        self.batches: list[wire.Batch] = []
        st = self.rm.stats

        def keep(b: wire.Batch) -> bool:
            self.batches.append(b)
            return True

        self.follower = PoolFollower(
            self.pool, keep, digest_every=1, stats=lambda: (st.requests, st.queries, st.hits)
        )
        self.rng = random.Random(args.seed)
        rng = self.rng
        # shared prefixes (system prompts, documents): most of a prompt is one
        self.prefixes = [
            [rng.randrange(32000) for _ in range(rng.randrange(512, 4096))]
            for _ in range(args.prefixes)
        ]
        self.args = args
        self.left: dict[str, int] = {}  # running request -> decode tokens still to come
        self.counter = 0
        self.refused = 0
        self.start = self.follower.capture_now()  # the empty pool, for the mirror's join

    def _prompt(self) -> list[int]:
        rng = self.rng
        total = rng.randrange(1024, 8192)
        prefix = rng.choice(self.prefixes)[:total]
        return prefix + [rng.randrange(32000) for _ in range(total - len(prefix))]

    def _admit(self, now: float) -> None:
        self.counter += 1
        rid = f"req-{self.counter}"
        prompt = self._prompt()
        try:
            got = self.rm.admit(rid, prompt)
        except Exception:  # the pool is full: it waits (the next step tries again)
            self.refused += 1
            return
        hashes = [bytes(h) for h in self.rm.requests[rid].block_hashes]
        self.follower.request(wire.Arrive(rid, now, len(prompt), hashes))
        self.follower.request(wire.Scheduled(rid, now, got.num_computed_tokens))
        lo, hi = self.args.decode
        self.left[rid] = self.rng.randrange(lo, hi)

    def step(self) -> None:
        now = time.time()
        rm = self.rm
        tok = self.rng.randrange(32000)
        done = []
        for rid in self.left:
            try:
                rm.append_tokens(rid, [tok])
            except Exception:  # no room: it finishes early (a preemption's effect)
                self.left[rid] = 0
            self.left[rid] -= 1
            if self.left[rid] <= 0:
                done.append(rid)
        for rid in done:
            n = rm.requests[rid].num_tokens
            rm.finish(rid)
            del self.left[rid]
            self.follower.request(wire.Finished(rid, now, n))
        for _ in range(self.args.running - len(self.left)):
            self._admit(now)
        self.follower.flush()

    def hello(self, control_port: int | None) -> wire.Hello:
        return wire.Hello(
            protocol=wire.PROTOCOL,
            engine_id="bench-engine",
            vllm_version="0.16.0",
            num_gpu_blocks=self.pool.num_gpu_blocks,
            block_size=BLOCK,
            hash_block_size=BLOCK,
            hash_fn="sha256",
            groups=[wire.Group(0, "FullAttentionSpec", BLOCK)],
            free_order="append_all",
            exact=True,
            problems=[],
            digest_every=1,
            control_port=control_port,
            started_at=1.0,
            seq=0,
            model="bench",
        )


def summarize(batches: list[wire.Batch]) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    blocks = 0
    for b in batches:
        for op in b.ops:
            name = type(op).__name__
            kinds[name] = kinds.get(name, 0) + 1
            blocks += len(getattr(op, "ids", ()))
    n = max(1, len(batches))
    return {
        "ops_per_step": round(sum(kinds.values()) / n, 1),
        "blocks_named_per_step": round(blocks / n, 1),
        "ops_by_kind_per_step": {k: round(v / n, 2) for k, v in sorted(kinds.items())},
        "records_per_step": round(sum(len(b.requests) for b in batches) / n, 2),
    }


def wait_mirror(client: httpx.Client, url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"blockpool serve exited ({proc.returncode})")
        try:
            m = client.get(url).json()
            if m.get("synced"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the mirror did not sync in 120 s")


def spy(pid: int, path: Path, seconds: float) -> list[subprocess.Popen[bytes]]:
    """py-spy recording the service for ``seconds``: raw stacks and a flame graph."""
    exe = Path(sys.executable).parent / "py-spy"
    tool = str(exe) if exe.exists() else "py-spy"
    path.parent.mkdir(parents=True, exist_ok=True)
    base = [
        tool,
        "record",
        "--pid",
        str(pid),
        "-d",
        str(int(seconds)),
        "-r",
        "100",
        "--nonblocking",
    ]
    return [
        subprocess.Popen([*base, "--format", fmt, "-o", str(path.with_suffix(ext))],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fmt, ext in (("raw", ".txt"),)
    ]  # fmt: skip


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children now (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps-per-s", type=float, default=200.0)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of replay")
    ap.add_argument("--running", type=int, default=256, help="requests decoding at once")
    ap.add_argument("--num-blocks", type=int, default=131_072)
    ap.add_argument("--prefixes", type=int, default=48, help="shared prompt prefixes")
    ap.add_argument(
        "--decode", type=int, nargs=2, default=(200, 1000), metavar=("MIN", "MAX"),
        help="decode tokens per request (uniform)",
    )  # fmt: skip
    ap.add_argument("--warmup", type=int, default=0, help="steps computed before the replay")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--serve-arg", action="append", default=[], help="one more serve flag")
    ap.add_argument("--drain-s", type=float, default=120.0, help="longest wait for the backlog")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--profile", type=Path, metavar="FILE",
        help="py-spy (on PATH or beside python) samples the service during the replay: "
        "FILE.txt (collapsed stacks) and FILE.svg",
    )  # fmt: skip
    args = ap.parse_args()

    steps = int(args.steps_per_s * args.duration)
    t = time.perf_counter()
    w = Workload(args)
    for _ in range(args.warmup):
        w.step()
    if args.warmup:  # the mirror joins after them, from a snapshot of the pool then
        w.batches.clear()
        w.start = w.follower.capture_now()
    for _ in range(steps):
        w.step()
    batches = w.batches
    gen_s = time.perf_counter() - t
    shape = summarize(batches)
    print(f"computed {len(batches)} steps in {gen_s:.1f} s: {shape}", file=sys.stderr)

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    box: dict[str, int | None] = {"port": None}
    sender = Sender(
        endpoint,
        hello=lambda: w.hello(box["port"]),
        capture=lambda: w.start,
        stats=lambda: w.start.stats,
        control_endpoint=f"tcp://127.0.0.1:{free_port()}",
        max_queue=1 << 16,
    )
    sender.start()
    box["port"] = sender.control_port
    http_port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [
        sys.executable, "-m", "app.cli", "serve", "--mirror", endpoint,
        "--host", "127.0.0.1", "--port", str(http_port), *args.serve_arg,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{http_port}/api/mirror"
    samples: list[dict[str, Any]] = []
    try:
        with httpx.Client(timeout=30) as client:
            wait_mirror(client, url, proc)
            base = client.get(url).json()["batches"]
            stop = threading.Event()
            offered = [0]

            def watch() -> None:
                while not stop.wait(0.5):
                    try:
                        m = client.get(url).json()
                    except httpx.HTTPError:
                        continue
                    samples.append(
                        {
                            "t": time.perf_counter() - t0,
                            "backlog": offered[0] - (m["batches"] - base),
                            "lag_ms": m["lag_ms"],
                            "lag_p99_ms": m["lag_p99_ms"],
                            "exact": m["exact"],
                        }
                    )

            spies = [] if args.profile is None else spy(proc.pid, args.profile, args.duration)
            cpu0 = cpu_s(proc.pid)
            t0 = time.perf_counter()
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            period = 1.0 / args.steps_per_s
            late = 0
            for i, b in enumerate(batches):
                due = t0 + i * period
                ahead = due - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
                elif ahead < -0.05:
                    late += 1
                b.ts = time.time()
                sender.offer(b)
                offered[0] = i + 1
            sent_s = time.perf_counter() - t0
            deadline = time.monotonic() + args.drain_s
            while time.monotonic() < deadline:
                m = client.get(url).json()
                if m["batches"] - base >= len(batches) or m["divergences"] or m["gaps"]:
                    break
                time.sleep(0.1)
            drain_s = time.perf_counter() - t0 - sent_s
            service_cpu = cpu_s(proc.pid) - cpu0
            stop.set()
            watcher.join()
            final = client.get(url).json()
            for p in spies:
                p.wait(timeout=60)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        sender.close()
    lags = [s["lag_ms"] for s in samples if s["lag_ms"] is not None]
    p99s = [s["lag_p99_ms"] for s in samples if s["lag_p99_ms"] is not None]
    out = {
        "target_steps_per_s": args.steps_per_s,
        "engine_steps_per_s": round(len(batches) / sent_s, 1),
        "steps": len(batches),
        "late_steps": late,
        "workload": shape | {"running": args.running, "num_blocks": args.num_blocks},
        "mirror": {
            "applied": final["batches"] - base,
            "exact": final["exact"],
            "digests_checked": final["digests_checked"],
            "divergences": final["divergences"],
            "gaps": final["gaps"],
            "resyncs": final["resyncs"],
            "engine_drops": final["engine_drops"],
            "ops_applied": final["ops_applied"],
            "lag_p50_ms_last2000": final["lag_p50_ms"],
            "lag_p99_ms_last2000": final["lag_p99_ms"],
            "lag_p99_ms_worst_window": max(p99s) if p99s else None,
            "lag_ms_max_sampled": max(lags) if lags else None,
            "backlog_max": max((s["backlog"] for s in samples), default=None),
            "drain_s": round(drain_s, 2),
            # the service's CPU (its threads and its analysis worker) while it applied them
            "service_cpu_s": round(service_cpu, 2),
            "exact_throughout": all(s["exact"] for s in samples),
        },
        "sender": {"sent": sender.sent, "dropped": sender.dropped},
        "serve_args": args.serve_arg,
    }
    tail = err.decode(errors="replace").strip().splitlines()[-5:]
    if any("Traceback" in line or "ERROR" in line for line in tail):
        out["serve_log_tail"] = tail
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
