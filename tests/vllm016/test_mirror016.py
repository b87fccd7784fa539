"""The mirror follows vLLM 0.16.0's own scheduler, exactly (append free order).

vLLM 0.16.0's Scheduler, KVCacheManager and BlockPool (the pure-Python parts
of its PyPI wheel) run in the 0.16.0 environment with blockpool's
``MirrorScheduler`` on top (tests/vllm016/drive_mirror016.py); this test
subscribes to what the plugin publishes over ZMQ, starts from a snapshot
the plugin serves, applies every batch to a blockpool runtime and compares
the plugin's digests of the real pool with its own.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from blockpool.mirror import (
    TOPIC,
    Hello,
    MirrorApplier,
    Snapshot,
    SnapshotRequest,
    decode,
    encode,
    pool_digest,
)
from blockpool.mirror.protocol import Preempted, batches_of
from blockpool.runtime import PoolRuntime, RuntimeConfig
from tests.vllm_engine.engine import free_port_pair
from tests.vllm_envs import vllm016_python

pytestmark = pytest.mark.vllm016

REPO = Path(__file__).resolve().parents[2]
NUM_BLOCKS = 32  # tight: requests are preempted and blocks evicted
TIMEOUT_S = 600.0


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[dict[str, Any]]:
    out: queue.Queue[dict[str, Any]] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                out.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    return out


def test_the_mirror_follows_vllm_016s_scheduler(tmp_path: Path) -> None:
    python = vllm016_python()
    port = free_port_pair()
    endpoint = f"tcp://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLOCKPOOL_", "VLLM_"))}
    env.update(PYTHONPATH=str(REPO), PYTHONHASHSEED="0", BLOCKPOOL_MIRROR_ENDPOINT=endpoint,
               BLOCKPOOL_MIRROR_DIGEST_EVERY="8", HF_HOME=str(tmp_path / "hf"))  # fmt: skip
    script = str(Path(__file__).with_name("drive_mirror016.py"))
    with (tmp_path / "driver.log").open("w") as log:
        proc = subprocess.Popen(
            [python, script, str(tmp_path), str(NUM_BLOCKS), "120"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=REPO,
            env=env,
        )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint)
    try:
        out = lines_of(proc)
        deadline = time.monotonic() + TIMEOUT_S

        def recv() -> Any:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    log = (tmp_path / "driver.log").read_text()[-3000:]
                    raise AssertionError(f"the driver exited ({proc.returncode}):\n{log}")
                if sub.poll(200):
                    topic, data, mac = sub.recv_multipart()
                    assert topic == TOPIC and mac == b""
                    return decode(data)
            raise AssertionError("no message from the plugin in time")

        while not isinstance(hello := recv(), Hello):
            pass
        assert hello.vllm_version == "0.16.0" and hello.free_order == "append_all"
        assert hello.exact and not hello.problems and hello.num_gpu_blocks == NUM_BLOCKS
        assert [g.kind for g in hello.groups] == ["FullAttentionSpec"]
        rt = PoolRuntime(
            RuntimeConfig(
                num_blocks=NUM_BLOCKS,
                block_size=hello.block_size,
                hash_fn="sha256",
                free_order=hello.free_order,
            )
        )
        applier = MirrorApplier(rt)
        req = ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(f"tcp://127.0.0.1:{hello.control_port}")
        request = SnapshotRequest(reason="start", ts=time.time(), nonce=os.urandom(16))
        req.send_multipart([encode(request), b""])
        assert req.poll(60_000)
        payload, mac = req.recv_multipart()
        req.close(0)
        snap = decode(payload)
        assert isinstance(snap, Snapshot) and mac == b""
        applier.restore(snap)
        final: dict[str, Any] | None = None
        checked = batches = preempted = 0
        while final is None or applier.next_op < final["ops"]:
            for batch in batches_of(recv()):
                checked += rt.run(lambda m=batch: applier.apply_batch(m)).digest_checked
                batches += 1
                preempted += sum(1 for r in batch.requests if isinstance(r, Preempted))
            while final is None and not out.empty():
                line = out.get()
                final = line if "ops" in line else None
        assert final is not None
        assert applier.next_op == final["ops"]
        assert pool_digest(rt.pool) == final["digest"]
        assert checked >= 5, (checked, batches)
        assert final["drops"] == 0
        # the engine's prefix-cache totals travel with the stream
        assert rt.manager.stats.hits == final["stats"][2] == final["hits"] > 0
        assert preempted > 0  # the pool was tight enough that vLLM preempted
        rt.check()
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
        sub.close(0)
        ctx.destroy(0)
