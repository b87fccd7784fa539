"""The GPU-scale bench's processes (bench/gpu_scale/run.py): a measured run
of one variant (plain or the plugin's, a process of its own: its own heap and
garbage collector), its command line and environment, the subscriber a run
may have, and the loopback ports the plugin binds."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def free_port_pair() -> int:
    """A loopback port P with P+1 free too (the plugin's PUB and control)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of loopback ports")


def child_argv(args: argparse.Namespace, variant: str, async_sched: bool, warmup: str) -> list[str]:
    argv = [sys.executable, "-m", "bench.gpu_scale.run", "--child", variant]
    argv += ["--num-blocks", str(args.num_blocks), "--block-size", str(args.block_size)]
    argv += ["--max-num-seqs", str(args.max_num_seqs)]
    argv += ["--max-batched-tokens", str(args.max_batched_tokens)]
    argv += ["--max-model-len", str(args.max_model_len), "--steps", str(args.steps)]
    argv += ["--warmup", warmup, "--max-warmup", str(args.max_warmup)]
    argv += ["--warmup-extra", str(args.warmup_extra), "--sleep-ms", str(args.sleep_ms)]
    argv += ["--warmup-max-tokens", str(args.warmup_max_tokens)]
    argv += ["--settle-steps", str(args.settle_steps)]
    if args.warmup_sleep_ms is not None:
        argv += ["--warmup-sleep-ms", str(args.warmup_sleep_ms)]
    argv += ["--seed", str(args.seed), "--concurrency", str(args.concurrency)]
    argv += ["--min-prompt", str(args.min_prompt), "--max-prompt", str(args.max_prompt)]
    if args.trace:
        argv += ["--trace", str(Path(args.trace).resolve())]
    if async_sched:
        argv.append("--child-async")
    return argv


def spawn(
    argv: list[str], endpoint: str, out: Path, digest_on_engine: bool = False
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKPOOL_MIRROR")}
    if digest_on_engine:  # the plugin's digest on the engine's thread (the plain run ignores it)
        env["BLOCKPOOL_MIRROR_DEFER_DIGEST"] = "0"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONHASHSEED", "0")
    done = subprocess.run(
        [*argv, "--endpoint", endpoint, "--child-out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {argv[argv.index('--child') + 1]} run failed ({done.returncode})")
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def start_subscriber(endpoint: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-m", "bench.gpu_scale.subscriber", endpoint],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def stop_subscriber(proc: subprocess.Popen[str]) -> dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    got: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return got
