#!/usr/bin/env python3
"""check_vllm_kvevents.py -- our KV-event stream against vLLM 0.16.0's real classes.

A manual check (CI has no vLLM; the pytest suite never needs it):

    .venv/bin/python bench/check_vllm_kvevents.py [--vllm-python /tmp/vllm016/bin/python]

Two directions, over loopback ZMQ, with bench/vllm_kvevents_peer.py running
in vLLM's interpreter (it imports nothing of ours):

1. **A real vLLM publishing, our observer reading.**  vLLM's KVCacheManager
   runs seeded traffic and its real ``ZmqEventPublisher`` publishes every
   step's events (topic, seq, positional msgpack; ROUTER replay).  Our
   observer follows it -- dropping a few live messages on purpose so that it
   must ask vLLM's ROUTER for replays -- and its rebuilt hash map must equal
   the hash map of vLLM's pool (hashes as vLLM's events show them).
2. **Our publisher, vLLM's decoder reading.**  Our engine's ticks go out
   through our publisher; vLLM's ``KVEventBatch`` decoder must read every
   payload back to the events our engine emitted, re-encode each to the very
   same bytes, and read the replay of every batch from our ROUTER.

Prints what it checked; exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from app.observer.fleet import Fleet  # noqa: E402
from app.observer.source import Source  # noqa: E402
from app.pool.engine import Engine  # noqa: E402
from app.shared.settings import Settings  # noqa: E402
from blockpool import KVEventBatch  # noqa: E402
from blockpool.kvevents.config import KVEventsConfig, SourceSpec  # noqa: E402
from blockpool.kvevents.publisher import KVEventPublisher  # noqa: E402

PEER = ROOT / "bench" / "vllm_kvevents_peer.py"


class Mismatch(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_peer(python: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [python, str(PEER), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise Mismatch(f"the vLLM peer exited ({proc.wait()})")
        if line.startswith("{"):
            msg: dict[str, Any] = json.loads(line)
            if "error" in msg:
                raise Mismatch(f"vLLM peer: {msg['error']}")
            return msg


def tell(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


# ---------------------------------------------------------------- direction 1


async def vllm_to_observer(python: str, steps: int, seed: int) -> None:
    pub_port, replay_port = free_port(), free_port()
    peer = start_peer(python, "publish", pub_port, replay_port, steps, seed)
    try:
        read(peer)  # ready
        src = Source(
            SourceSpec("vllm", f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", 0),
            topic="kv",
        )
        fleet = Fleet([src])
        await fleet.start()
        try:
            deadline = time.monotonic() + 20
            while not src.connected:
                if time.monotonic() > deadline:
                    raise Mismatch("our observer never connected to vLLM's PUB socket")
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            # lose a few live messages on purpose: vLLM's ROUTER must fill them
            lose = {3, 11, 12, 30, 31, 32}
            live = src._live

            def lossy(frames: list[bytes]) -> int | None:
                if len(frames) == 3 and int.from_bytes(frames[1], "big") in lose:
                    return None
                return live(frames)

            src._live = lossy  # type: ignore[method-assign]
            tell(peer, "go")
            result = await asyncio.to_thread(read, peer)
            last = result["last_seq"]
            deadline = time.monotonic() + 30
            t = src.tracker
            while t.applied != last or t.replaying or t.pending:
                if time.monotonic() > deadline:
                    raise Mismatch(f"the observer stopped at seq {t.applied} of {last}")
                await asyncio.sleep(0.02)
            want = {int(h): n for h, n in result["held"].items()}
            got = src.state.copies()
            if got != want:
                only_v = {h: n for h, n in want.items() if got.get(h) != n}
                only_o = {h: n for h, n in got.items() if want.get(h) != n}
                raise Mismatch(f"hash maps differ: vLLM {only_v} observer {only_o}")
            if not t.exact or t.missed or t.replay_failures:
                raise Mismatch(f"observer not exact: {t.reason} / {t.last_failure}")
            if t.replays == 0:
                raise Mismatch("no replay was exercised")
            print(
                f"1. vLLM ZmqEventPublisher -> our observer: {t.batches} batches, "
                f"{src.events_total} events, {t.gaps} gaps filled by {t.replays} replays from "
                f"vLLM's ROUTER ({t.replay_batches} batches, {t.duplicates} duplicates skipped); "
                f"hash map equals vLLM's pool: {len(want)} hashes, {sum(want.values())} blocks"
            )
        finally:
            await fleet.stop()
        tell(peer, "quit")
        peer.wait(20)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()


# ---------------------------------------------------------------- direction 2


def ours_to_vllm(python: str, ticks: int, seed: int) -> None:
    from app.pool.schemas import AdmitOp, AppendOp, FinishOp, ResetOp
    from app.shared.errors import OperationError

    pub = KVEventPublisher(
        KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                       topic="kv@blockpool", data_parallel_rank=0, bind="bind")
    )  # fmt: skip
    pub.start()
    engine = Engine(Settings(num_blocks=96, block_size=4, storage=False, hash_seed="0"))
    emitted: list[Any] = []
    try:
        peer = start_peer(python, "subscribe", pub.bound_endpoint, pub.bound_replay_endpoint)
        try:
            read(peer)  # subscribed
            pub.attach(engine)
            engine.listeners.append(lambda d: emitted.append(d) if d.events else None)
            rng = random.Random(seed)
            docs = [[rng.randrange(50) for _ in range(4 * rng.randint(1, 6))] for _ in range(5)]
            for _ in range(ticks):
                running = list(engine.manager.requests)
                for _ in range(rng.randint(1, 3)):
                    x = rng.random()
                    try:
                        if x < 0.4 or not running:
                            toks = rng.choice(docs) + [rng.randrange(50) for _ in range(5)]
                            lora = "sql" if rng.random() < 0.1 else None
                            running.append(
                                engine.apply(AdmitOp(token_ids=toks, lora_name=lora))["request_id"]
                            )
                        elif x < 0.75:
                            engine.apply(AppendOp(request_id=rng.choice(running), token_ids=[7]))
                        elif x < 0.98:
                            rid = running.pop(rng.randrange(len(running)))
                            engine.apply(FinishOp(request_id=rid))
                        else:
                            engine.apply(ResetOp())
                    except OperationError:
                        pass
                engine.tick()
            deadline = time.monotonic() + 10
            while pub.last_published_seq != len(emitted) - 1:
                if time.monotonic() > deadline:
                    raise Mismatch("our publisher did not send every batch")
                time.sleep(0.01)
            tell(peer, f"last {len(emitted) - 1}")
            result = read(peer)
            peer.wait(20)
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
    finally:
        pub.stop()
    engine.check()
    live, replayed = result["live"], result["replayed"]
    if [b["seq"] for b in live] != list(range(len(emitted))):
        raise Mismatch(f"seqs: {[b['seq'] for b in live][:10]}…")
    for got, tick in zip(live, emitted, strict=True):
        ours = msgspec.to_builtins(
            KVEventBatch(ts=tick.ts, events=[ev for _, _, ev in tick.events], data_parallel_rank=0)
        )
        if got["batch"] != ours or got["topic"] != "kv@blockpool":
            raise Mismatch(f"batch {got['seq']}: vLLM read {got['batch']} we sent {ours}")
    if result["identical_reencodings"] != len(live):
        raise Mismatch("vLLM re-encoded some payloads to other bytes")
    if replayed != [{"seq": b["seq"], "batch": b["batch"]} for b in live]:
        raise Mismatch("the replay differs from the live stream")
    n_events = sum(len(t.events) for t in emitted)
    print(
        f"2. our publisher -> vLLM's KVEventBatch decoder: {len(live)} batches, {n_events} "
        f"events equal to what our engine emitted; vLLM re-encodes every payload to the same "
        f"bytes; replay from seq 0 returned all {len(replayed)} batches"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", default="/tmp/vllm016/bin/python")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # refused resets warn, as vLLM's do
    if not Path(args.vllm_python).exists():
        print(f"check_vllm_kvevents: no vLLM interpreter at {args.vllm_python}", file=sys.stderr)
        return 2
    try:
        asyncio.run(vllm_to_observer(args.vllm_python, args.steps, args.seed))
        ours_to_vllm(args.vllm_python, args.steps // 2, args.seed)
    except Mismatch as exc:
        print(f"MISMATCH: {exc}", file=sys.stderr)
        return 1
    print("OK: the wire form matches vLLM 0.16.0 both ways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
