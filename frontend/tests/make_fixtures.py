"""Write stream frames made by the real server code, for the JS unit tests.

    python frontend/tests/make_fixtures.py OUT_DIR

Drives a real Engine + StreamHub (no sockets): every frame is what the hub
would send, byte for byte.  After each frame the Python reference
(app.stream.replica.PoolReplica) records what a client must hold then; the JS
model is checked against those expectations.

Scenarios (each a folder with manifest.json + NNN-kind.bin):

* ``small``  64 blocks of 4 tokens: admits with shared prefixes, a duplicate
  hash (two physical copies), finishes (stamps), raw allocate (evictions),
  raw cache with one hash on two blocks, an empty tick, reset, more admits.
* ``restart`` the config + snapshot of a second server (another epoch).
* ``mirror`` the frames of a mirror service (the hub's ``follow_mirror``
  set as ``blockpool serve --mirror`` sets it): a snapshot carrying an
  engine batch, deltas bringing new batches, one repeating a batch.
* ``large``  100,000 blocks: a snapshot and deltas of ~1,000 changed blocks.
* ``analysis`` 48 blocks of 4 tokens, the analysis inline with inline shadow
  pools: every frame carries the stream's ``analysis`` section and
  ``tokens``; misses of each reason (floor, cold, last token, evicted,
  extra keys, chain broken), regrets; plus the REST views the dashboard
  reads (``rest.json``: misses, regret, shadows, a running request's detail
  and its misses, a recorded moment and a diff), made by the same code.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import app.stream.hub as hub_module  # noqa: E402
from app.pool.engine import Engine  # noqa: E402
from app.pool.schemas import AdmitOp, AllocateOp, CacheOp, FinishOp, FreeOp, ResetOp  # noqa: E402
from app.pool.views.requests import request as request_view  # noqa: E402
from app.shared.settings import Settings  # noqa: E402
from app.stream import protocol as p  # noqa: E402
from app.stream.hub import StreamHub  # noqa: E402
from app.stream.replica import PoolReplica  # noqa: E402
from blockpool.analysis import moments  # noqa: E402
from blockpool.analysis import views as analysis_views  # noqa: E402
from blockpool.analysis.segment import EventsView  # noqa: E402


def expectation(m: PoolReplica, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": m.seq,
        "epoch": m.epoch,
        "counts": m.counts() if m.seq is not None else None,
        "header_blocks": m.header.get("blocks"),
        "num_events": len(m.events),
        "num_points": len(m.points),
    }
    if m.seq is None:
        return out
    hm = m.hash_map()
    out["hash_keys"] = len(hm)
    out["multi_keys"] = sum(1 for ids in hm.values() if len(ids) > 1)
    out["queue_len"] = len(m.queue_order())
    if full:
        out["state"] = m.state.tolist()
        out["ref_cnt"] = m.ref_cnt.tolist()
        out["stamp"] = m.stamp.tolist()
        out["queue"] = m.queue_order()
        out["hash_map"] = sorted([f"{h:016x}", g, ids] for (h, g), ids in hm.items())
    else:
        out["queue_head"] = m.queue_order()[:200]
        multi = sorted([f"{h:016x}", g, ids] for (h, g), ids in hm.items() if len(ids) > 1)
        out["multi_sample"] = multi[:50]
    return out


class Recorder:
    def __init__(self, out: Path, name: str, settings: Settings, full: bool) -> None:
        self.dir = out / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.engine = Engine(settings)
        self.hub = StreamHub(self.engine)
        self.replica = PoolReplica()
        self.full = full
        self.items: list[dict[str, Any]] = []

    def emit(self, frame: bytes, note: str = "") -> None:
        decoded = p.decode(frame)
        self.replica.apply(decoded)
        name = f"{len(self.items):03d}-{decoded.kind_name}.bin"
        (self.dir / name).write_bytes(frame)
        self.items.append(
            {
                "file": name,
                "kind": decoded.kind_name,
                "seq": decoded.seq,
                "note": note,
                "ids": len(decoded.columns.get("ids", [])),
                "expect": expectation(self.replica, self.full),
            }
        )

    def start(self) -> None:
        """What a new client gets: config, then a snapshot at the next tick."""
        self.emit(self.hub.config_frame(), "config")
        self.engine.tick()  # the first tick (everything dirty) goes to the ring
        self.emit(self.hub.snapshot_frame(), "snapshot")

    def step(self, note: str, fn: Callable[[Engine], Any] | None = None) -> None:
        if fn is not None:
            fn(self.engine)
        self.engine.tick()
        self.emit(self.hub.ring.frames[-1].full, note)

    def finish(self) -> None:
        manifest = {"epoch": self.hub.epoch, "frames": self.items}
        (self.dir / "manifest.json").write_text(json.dumps(manifest))


def small(out: Path) -> str:
    settings = Settings(num_blocks=64, block_size=4, hash_fn="sha256", hash_seed="0")
    r = Recorder(out, "small", settings, full=True)
    r.start()
    a = list(range(100, 122))  # 5 full blocks + 2 tokens
    b = a[:12] + list(range(500, 513))  # shares 3 blocks with A
    c = a[:20]  # 5 full blocks: its last block is recomputed -> a second copy
    r.step("admit A", lambda e: e.apply(AdmitOp(request_id="A", token_ids=a)))
    r.step("admit B (shared prefix)", lambda e: e.apply(AdmitOp(request_id="B", token_ids=b)))
    r.step("admit C (duplicate)", lambda e: e.apply(AdmitOp(request_id="C", token_ids=c)))
    r.step("finish A", lambda e: e.apply(FinishOp(request_id="A")))
    r.step("empty tick")

    def dup(e: Engine) -> None:
        ids = e.apply(AllocateOp(num_blocks=2))["block_ids"]
        h = "ab" * 32
        e.apply(CacheOp(block_ids=[ids[0]], block_hashes=[h]))
        e.apply(CacheOp(block_ids=[ids[1]], block_hashes=[h]))
        e.apply(FreeOp(block_ids=ids))

    r.step("one hash cached on two blocks", dup)
    r.step("finish B and C", lambda e: (_finish(e, "B"), _finish(e, "C")))
    held: list[int] = []

    def alloc(e: Engine) -> None:
        held.extend(e.apply(AllocateOp(num_blocks=58))["block_ids"])

    r.step("allocate 58 (evicts cached blocks)", alloc)
    r.step("free 30 raw blocks, shuffled", lambda e: e.apply(FreeOp(block_ids=_take(held, 30))))
    r.step("free the rest", lambda e: e.apply(FreeOp(block_ids=_take(held, len(held)))))
    r.step("reset", lambda e: e.apply(ResetOp()))
    r.step("admit D after reset", lambda e: e.apply(AdmitOp(request_id="D", token_ids=b)))
    r.step("admit E", lambda e: e.apply(AdmitOp(request_id="E", token_ids=a)))
    r.step("finish D", lambda e: e.apply(FinishOp(request_id="D")))
    r.finish()
    return r.hub.epoch


def _take(held: list[int], n: int) -> list[int]:
    random.Random(len(held)).shuffle(held)
    out = held[:n]
    del held[:n]
    return out


def _finish(e: Engine, rid: str) -> None:
    e.apply(FinishOp(request_id=rid))


def restart(out: Path, other_epoch: str) -> None:
    while f"{time.time():.6f}" == other_epoch:
        time.sleep(0.001)
    settings = Settings(num_blocks=32, block_size=4, hash_fn="sha256", hash_seed="0")
    r = Recorder(out, "restart", settings, full=True)
    r.start()
    r.step("admit", lambda e: e.apply(AdmitOp(request_id="X", token_ids=list(range(30)))))
    r.finish()


def mirror(out: Path) -> None:
    """A mirror's frames: each carries the newest engine batch applied before
    it (``mirror: {engine_ts, batch}``), as app/mirror/setup.py wires it."""
    settings = Settings(num_blocks=32, block_size=4, hash_fn="sha256", hash_seed="0")
    r = Recorder(out, "mirror", settings, full=True)
    applied: dict[str, Any] = {}
    r.hub.follow_mirror(lambda: dict(applied) if applied else None)
    r.emit(r.hub.config_frame(), "config")
    r.engine.tick()
    r.emit(r.hub.snapshot_frame(), "snapshot before any batch")
    r.step("an idle tick, no batch yet")
    applied.update(engine_ts=1764417600.25, batch=7)
    r.step("batch 7", lambda e: e.apply(AdmitOp(request_id="X", token_ids=list(range(30)))))
    r.step("batch 7 again (the engine idle)")
    applied.update(engine_ts=1764417601.5, batch=8)
    r.step("batch 8", lambda e: e.apply(FinishOp(request_id="X")))
    r.emit(r.hub.snapshot_frame(), "a snapshot (a resync) with batch 8")
    applied.update(engine_ts=1764417602.0, batch=9)
    r.emit(r.hub.snapshot_frame(), "a snapshot with batch 9")
    applied.update(engine_ts=1764417603.0, batch=10)
    r.step("batch 10")
    r.finish()


def large(out: Path) -> None:
    settings = Settings(num_blocks=100_000, block_size=16, hash_fn="sha256", hash_seed="0")
    r = Recorder(out, "large", settings, full=False)
    rng = random.Random(7)
    held: list[int] = []

    def prime(e: Engine) -> None:
        for i in range(300):
            toks = [rng.randrange(32000) for _ in range(16 * 40)]
            e.apply(AdmitOp(request_id=f"p{i}", token_ids=toks))
        for i in range(0, 300, 2):
            e.apply(FinishOp(request_id=f"p{i}"))

    prime(r.engine)
    r.start()

    def churn(e: Engine) -> None:
        held.extend(e.apply(AllocateOp(num_blocks=500))["block_ids"])
        e.apply(FreeOp(block_ids=_take(held, min(len(held), 500))))

    for i in range(6):
        r.step(f"churn {i}", churn)
    r.finish()


def analysis(out: Path) -> None:
    settings = Settings(
        num_blocks=48,
        block_size=4,
        hash_fn="sha256",
        hash_seed="0",
        analysis_mode="inline",
        shadow_mode="inline",
        shadow_factors=[0.5, 2.0],
        recording_keyframe_ops=10,
    )
    # every tick carries the section here (the server sends it once a second)
    hub_module.ANALYSIS_EVERY_S = 0.0
    r = Recorder(out, "analysis", settings, full=False)
    host = r.engine.analysis
    assert host is not None and host.inline is not None
    an = host.inline

    def step(note: str, fn: Callable[[Engine], Any]) -> None:
        time.sleep(0.02)  # sections a little apart in time (their ts)
        r.step(note, fn)

    a = list(range(100, 122))  # 5 full blocks + 2 tokens
    b = a[:10] + list(range(600, 611))  # shares 2 blocks + 2 tokens of the 3rd
    r.start()
    step("admit A", lambda e: e.apply(AdmitOp(request_id="A", token_ids=a)))
    step("finish A", lambda e: e.apply(FinishOp(request_id="A")))
    step("admit B (floor)", lambda e: e.apply(AdmitOp(request_id="B", token_ids=b)))
    step("admit A2 (hits)", lambda e: e.apply(AdmitOp(request_id="A2", token_ids=a[:20])))
    step(
        "admit S (salt)",
        lambda e: e.apply(AdmitOp(request_id="S", token_ids=a[:8], cache_salt="x")),
    )

    def finish_all(e: Engine) -> None:
        for rid in ("B", "A2", "S"):
            _finish(e, rid)

    step("finish all", finish_all)
    held: list[int] = []

    def flood(e: Engine) -> None:
        held.extend(e.apply(AllocateOp(num_blocks=47))["block_ids"])
        e.apply(FreeOp(block_ids=_take(held, len(held))))

    step("evict everything", flood)
    step("admit A3 (evicted, regret)", lambda e: e.apply(AdmitOp(request_id="A3", token_ids=a)))
    step("empty tick", lambda e: None)  # noqa: ARG005 the step callback's signature
    r.finish()
    rec = an.recorder
    assert rec is not None
    first, last = rec.first_seq, rec.seq
    mid = (first + last) // 2

    def moment(seq: int) -> moments.RebuiltMoment:
        seg = rec.segment_for(seq)
        assert seg is not None
        entries = seg.entries(0, seq - seg.keyframe.seq)
        return moments.rebuild(seg.keyframe, entries, r.engine.config)

    ma, mb = moment(mid), moment(last)
    rest = {
        "misses": analysis_views.misses(an, limit=50),
        "regret": analysis_views.regret(an, limit=20),
        "shadows": analysis_views.shadows(an),
        "request": request_view(r.engine, "A3").model_dump(mode="json", exclude_unset=True),
        "request_misses": analysis_views.request_misses(an, rid="B"),
        "history_state": {"seq": mid, **moments.state_json(ma, 1000, True)},
        "history_diff": moments.diff_json(
            ma, mb, rec.entries_between(mid, last), EventsView(r.engine.events), 1000
        ),
    }
    (r.dir / "rest.json").write_text(json.dumps(rest, default=str))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    epoch = small(out)
    restart(out, epoch)
    mirror(out)
    large(out)
    analysis(out)
    (out / "READY").write_text("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
