"""The soak harness: ``blockpool serve`` (a real process) running the demo at
its top rate with stream clients attached, its memory (the whole process
tree: the server, the analysis worker, the shadow process) sampled as it
runs.  Used by ``test_soak_service.py`` and, to measure the ceiling of each
setting for docs/sizing.md, as a script:

    python -m tests.app.soak --seconds 120 --set event_log_capacity=20000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TOP_RATE = 500.0  # the demo's top rate (Settings.demo_rate's bound)
MIB = 1024 * 1024

# What each bounded structure holds per entry, measured with ``measure()``
# (the demo's traffic, serve's defaults: 8,192 blocks of 16 tokens); the
# table in docs/sizing.md.  An event-log entry is one event: a BlockStored
# of a whole prompt carries all its blocks' hashes and tokens.
COST = {
    "event_log_entry": 4_000,  # 3.7 and 4.4 KB in two runs
    "sample_log_entry": 300,
    "recording_op": 330,  # ~260 encoded + ~70 of columns (also capped by recording_max_bytes)
    "keyframe_per_block": 185,  # one keyframe: ~1.5 MB at 8,192 blocks
    "miss_index_entry": 350,  # ring columns ~50 B, the evicted-hash map and prefix owners
    "series": 6_000 * 540,  # SERIES_CAPACITY points
    "stream_ring": 64 * MIB,  # RING_BYTES: the hard bound (RING_FRAMES = 1,200 frames)
}


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid``'s process tree (VmRSS summed)."""
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


@dataclass
class Sample:
    t: float
    rss: int
    ops: float


@dataclass
class SoakResult:
    settings: dict[str, str]
    samples: list[Sample] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)  # per client
    final: dict[str, Any] = field(default_factory=dict)

    def rss_at(self, frac: float) -> int:
        """RSS of the first sample at or after ``frac`` of the run."""
        end = self.samples[-1].t
        return next(s.rss for s in self.samples if s.t >= frac * end)

    def peak(self) -> int:
        return max(s.rss for s in self.samples)


async def _client(url: str, counter: list[int], i: int, stop: asyncio.Event) -> None:
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        while not stop.is_set():
            try:
                await asyncio.wait_for(ws.recv(), 1.0)
            except TimeoutError:
                continue
            counter[i] += 1


def _ops(h: httpx.Client) -> float:
    text = h.get("/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("blockpool_ops_total ") or line.startswith(
            "blockpool_operations_total "
        ):
            return float(line.split()[1])
    return float("nan")


async def soak(
    seconds: float, settings: dict[str, str], clients: int = 5, every: float = 5.0,
    log: Path | None = None, echo: bool = False,
    on_sample: Callable[[httpx.Client, float], None] | None = None,
) -> SoakResult:  # fmt: skip
    """Run the demo at its top rate with ``clients`` stream clients for
    ``seconds``; sample the server tree's RSS every ``every`` seconds."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKPOOL_")}
    env.update({f"BLOCKPOOL_{k.upper()}": v for k, v in settings.items()})
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--demo",
           "--demo-rate", str(TOP_RATE), "--log-level", "warning"]  # fmt: skip
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=out)
    result = SoakResult(dict(settings))
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as h:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"the server exited with {proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if h.get("/api/health", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise AssertionError("the server did not answer within 120 s")
                await asyncio.sleep(0.2)
            result.frames = [0] * clients
            url = f"ws://127.0.0.1:{port}/api/stream"
            tasks = [
                asyncio.create_task(_client(url, result.frames, i, stop)) for i in range(clients)
            ]
            t0 = time.monotonic()
            while True:
                t = time.monotonic() - t0
                ops = await asyncio.to_thread(_ops, h)
                result.samples.append(Sample(t, rss_bytes(proc.pid), ops))
                if on_sample is not None:
                    await asyncio.to_thread(on_sample, h, t)
                if echo:
                    s = result.samples[-1]
                    print(f"{s.t:6.0f} s  rss {s.rss / MIB:7.1f} MiB  ops {s.ops:,.0f}  "
                          f"frames {sum(result.frames):,}", flush=True)  # fmt: skip
                for task in tasks:
                    if task.done():
                        task.result()  # a client that died: raise its error
                if t >= seconds:
                    break
                await asyncio.sleep(min(every, max(0.0, seconds - t)))
            result.final = {
                "summary": h.get("/api/summary").json(),
                "health": h.get("/api/health").json(),
            }
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception):
                await task
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()  # type: ignore[union-attr]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--every", type=float, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()
    settings = dict(kv.split("=", 1) for kv in args.set)
    r = asyncio.run(soak(args.seconds, settings, args.clients, args.every, echo=True))
    print(json.dumps({
        "settings": settings, "peak_mib": round(r.peak() / MIB, 1),
        "first_mib": round(r.samples[0].rss / MIB, 1),
        "frames": r.frames, "ops": r.samples[-1].ops,
    }))  # fmt: skip


if __name__ == "__main__" and "--measure" not in sys.argv:
    main()


# ------------------------------------------------------------ per-entry costs


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes an object graph holds (containers, slotted and msgspec objects,
    arrays), each object counted once; small ints and interned singletons
    are shared with the interpreter and cost nothing extra."""
    seen = set() if seen is None else seen
    todo = [obj]
    total = 0
    while todo:
        o = todo.pop()
        if id(o) in seen or o is None or isinstance(o, bool | type):
            continue
        if isinstance(o, int) and -5 <= o <= 256:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset) or type(o).__name__ == "deque":
            todo.extend(o)
        elif isinstance(o, str | bytes | bytearray | int | float) or type(o).__name__ in (
            "array", "ndarray", "memoryview", "function", "method", "module",
        ):  # fmt: skip
            continue
        else:
            todo.extend(
                getattr(o, name, None) for name in getattr(o, "__struct_fields__", ()) or ()
            )
            for cls in type(o).__mro__:
                todo.extend(
                    getattr(o, name)
                    for name in getattr(cls, "__slots__", ()) or ()
                    if isinstance(name, str) and hasattr(o, name)
                )
            d = getattr(o, "__dict__", None)
            if isinstance(d, dict):
                todo.append(d)
    return total


async def measure(seconds: float = 40.0) -> dict[str, Any]:
    """Run the demo at its top rate in this process and weigh, per entry,
    what the bounded logs hold (the figures docs/sizing.md gives)."""
    from tests.stream.live import live_server

    async with live_server(
        paranoid=False,
        num_blocks=8192,
        block_size=16,
        tick_hz=20.0,
        demo=True,
        demo_rate=TOP_RATE,
    ) as app:  # serve's defaults
        await asyncio.sleep(seconds)
        engine = app.state.engine
        out: dict[str, Any] = {}
        for name, items in (
            ("event_log", engine.events.since(0, engine.events.capacity)[0]),
            ("sample_log", engine.samples.since(0, engine.samples.capacity)[0]),
            ("series", list(engine.series)),
        ):
            per = deep_size(items) / max(1, len(items))
            out[name] = {"entries": len(items), "bytes_per_entry": per}
        rec = engine.analysis.recorder if engine.analysis is not None else None
        if rec is not None:
            segs = list(rec.segments)
            kf = [s.keyframe for s in segs if getattr(s, "keyframe", None) is not None]
            ops = sum(len(s) for s in segs)
            seen: set[int] = set()
            kf_bytes = deep_size(kf, seen)
            all_bytes = deep_size(segs, seen)
            out["recording"] = {
                "ops": ops, "encoded_bytes": rec.nbytes, "segments": len(segs),
                "bytes_per_op_beyond_encoded": (all_bytes - rec.nbytes) / max(1, ops),
                "keyframe_bytes": kf_bytes / max(1, len(kf)),
            }  # fmt: skip
        hub = app.state.stream
        out["stream_ring"] = {"frames": len(hub.ring), "bytes": hub.ring_bytes}
        return out


if __name__ == "__main__" and "--measure" in sys.argv:
    print(json.dumps(asyncio.run(measure(float(sys.argv[-1]))), indent=1))
    sys.exit(0)
