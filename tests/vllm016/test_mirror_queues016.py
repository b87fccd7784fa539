"""A mirror's running and waiting requests equal vLLM 0.16.0's own scheduler
queues after every step, through preemptions and resumptions.

The driver (tests/vllm016/drive_mirror016.py) runs vLLM 0.16.0's Scheduler
with blockpool's ``MirrorScheduler`` on a pool tight enough that vLLM
preempts, and prints ``len(running)`` / ``len(waiting)`` after each step with
the number of the last batch the plugin sent; this test feeds every batch's
request records to the mirror's ``EngineQueues`` and compares at each."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from app.mirror.queues import EngineQueues
from blockpool.mirror import TOPIC, Hello, SnapshotRequest, decode, encode
from blockpool.mirror.protocol import Preempted, Scheduled, batches_of
from tests.vllm016.test_mirror016 import NUM_BLOCKS, REPO, TIMEOUT_S, lines_of
from tests.vllm_engine.engine import free_port_pair
from tests.vllm_envs import vllm016_python

pytestmark = pytest.mark.vllm016


def test_the_queues_equal_vllm_016s_scheduler_after_every_step(tmp_path: Path) -> None:
    python = vllm016_python()
    port = free_port_pair()
    endpoint = f"tcp://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLOCKPOOL_", "VLLM_"))}
    env.update(PYTHONPATH=str(REPO), PYTHONHASHSEED="0", BLOCKPOOL_MIRROR_ENDPOINT=endpoint,
               HF_HOME=str(tmp_path / "hf"))  # fmt: skip
    script = str(REPO / "tests/vllm016/drive_mirror016.py")
    with (tmp_path / "driver.log").open("w") as log:
        proc = subprocess.Popen(
            [python, script, str(tmp_path), str(NUM_BLOCKS), "120"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            cwd=REPO, env=env,
        )  # fmt: skip
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
                    return decode(sub.recv_multipart()[1])
            raise AssertionError("no message from the plugin in time")

        while not isinstance(hello := recv(), Hello):
            pass
        queues = EngineQueues()
        queues.heard(hello.seq, time.time())
        assert hello.seq == 0 and queues.counts()["running"] == 0
        # the driver starts its requests once a mirror asked for a snapshot
        req = ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(f"tcp://127.0.0.1:{hello.control_port}")
        req.send_multipart([encode(SnapshotRequest(reason="start", ts=time.time())), b""])
        assert req.poll(60_000)
        req.close(0)

        truth: dict[int, tuple[int, int]] = {}  # batch seq -> the scheduler's (running, waiting)
        mine: dict[int, tuple[int, int]] = {}  # ... the mirror's, after that batch
        final: dict[str, Any] | None = None
        preempted = resumed = 0
        preempted_ids: set[str] = set()
        while final is None or queues.last_seq < max(truth, default=0):
            for batch in batches_of(recv()):
                queues.batch(batch.seq, batch.ts, batch.requests)
                mine[batch.seq] = (queues.running, queues.waiting)
                for r in batch.requests:
                    if isinstance(r, Preempted):
                        preempted += 1
                        preempted_ids.add(r.rid)
                    elif isinstance(r, Scheduled) and r.rid in preempted_ids:
                        resumed += 1
            while final is None and not out.empty():
                line = out.get()
                if "seq" in line:
                    truth[line["seq"]] = (line["running"], line["waiting"])
                elif "ops" in line:
                    final = line
        compared = [seq for seq in truth if seq > 0]
        assert {seq: mine[seq] for seq in compared} == {seq: truth[seq] for seq in compared}
        assert queues.counts()["reason"] is None
        assert preempted > 0 and resumed > 0  # vLLM preempted, and resumed what it preempted
        assert len(compared) > 50, len(compared)
        assert (queues.running, queues.waiting) == (0, 0) and queues.ended == 120
        assert queues.started == 120  # a resumption is no start
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
