"""The plugin's engine side without vLLM: what it says it can follow, its control socket."""

from __future__ import annotations

import pytest
import zmq

from blockpool.mirror import (
    Snapshot,
    SnapshotRequest,
    decode,
    encode,
    pool_digest,
    snapshot_digest,
)
from blockpool.mirror.protocol import Group
from blockpool_vllm.engine_facts import free_order_for, problems_of, served_model
from blockpool_vllm.follower import TIME_EVERY
from blockpool_vllm.sender import Sender, next_port
from tests.app.conftest import free_port
from tests.mirror.workload import FollowedEngine
from tests.support.wait import eventually

FULL = [Group(0, "FullAttentionSpec", 16)]


@pytest.mark.parametrize(
    ("version", "order"),
    [("0.16.0", "append_all"), ("0.16.2rc1", "append_all"), ("0.24.0", "uncached_first"),
     ("0.32.0", "uncached_first"), ("1.2.0", "uncached_first"), ("0.20.1", None),
     ("0.15.0", None), ("dev", None)],
)  # fmt: skip
def test_the_free_order_follows_the_version(version: str, order: str | None) -> None:
    assert free_order_for(version) == order


def facts(**kw: object) -> list[str]:
    args: dict[str, object] = {
        "enable_caching": True, "block_size": 16, "hash_block_size": 16,
        "kv_connector": None, "hash_fn": "sha256",
    }  # fmt: skip
    version = str(kw.pop("version", "0.32.0"))
    groups = kw.pop("groups", FULL)
    args.update(kw)
    return problems_of(version, groups, **args)  # type: ignore[arg-type]


def test_what_the_mirror_cannot_follow_is_said() -> None:
    assert facts() == []
    assert "free order" in facts(version="0.20.0")[0]
    assert "prefix caching is off" in facts(enable_caching=False)[0]
    two = [Group(0, "FullAttentionSpec", 16), Group(1, "SlidingWindowSpec", 16)]
    got = facts(groups=two)
    assert any("2 KV-cache groups" in p for p in got)
    assert any("SlidingWindowSpec" in p for p in got)
    assert "hash block size" in facts(block_size=32)[0]
    assert "KV connector" in facts(kv_connector="LMCacheConnectorV1")[0]
    assert "hash function" in facts(hash_fn="blake3")[0]


def test_next_port_and_bad_endpoints() -> None:
    assert next_port("tcp://127.0.0.1:5590") == "tcp://127.0.0.1:5591"
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        next_port("ipc:///tmp/x")


def test_the_control_socket_ignores_strangers_and_serves_snapshots() -> None:
    engine = FollowedEngine()
    engine.drive(10)
    control = f"tcp://127.0.0.1:{free_port()}"
    sender = Sender(
        f"tcp://127.0.0.1:{free_port()}",
        engine.hello,
        engine.follower.poll_snapshot,
        engine.stats,
        control_endpoint=control,
    )
    assert sender.start()
    ctx = zmq.Context()
    try:
        for junk in ([b"hello?", b""], [encode(engine.hello()), b""]):  # not a request
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(control)
            dealer.send_multipart(junk)
            dealer.close(30_000)  # delivered after the close
        eventually(lambda: sender.bad_requests == 2, what="two strangers counted")
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(control)
        dealer.send_multipart([encode(SnapshotRequest(reason="test")), b""])
        assert dealer.poll(60_000)
        payload, mac = dealer.recv_multipart()
        dealer.close(0)
        snap = decode(payload)
        assert isinstance(snap, Snapshot) and mac == b""
        assert snap.ops == engine.follower.op_count
        assert snapshot_digest(snap) == pool_digest(engine.rt.pool)
        assert sender.snapshots == 1 and sender.bad_requests == 2
    finally:
        sender.close()
        ctx.destroy(0)
    engine.rt.check()


def test_the_served_model_name_is_the_handshakes() -> None:
    from types import SimpleNamespace as NS

    assert served_model(NS(model_config=NS(served_model_name="llama", model="/m/x"))) == "llama"
    assert served_model(NS(model_config=NS(served_model_name=["a", "b"], model="/m"))) == "a"
    assert served_model(NS(model_config=NS(served_model_name=None, model="/m/x"))) == "/m/x"
    assert served_model(NS(model_config=None)) is None
    assert served_model(object()) is None


def test_the_plugins_time_is_one_figure_a_batch_none_lost() -> None:
    """Before: a figure's place in the ring was the batch count *after* the
    batch, so the first figure read was a 0 never written (a p50 of 0 µs
    after one batch), and a flush that made no batch wrote over the last
    batch's figure."""
    engine = FollowedEngine(num_blocks=64)
    f = engine.follower
    f.time_every = 1  # every batch timed
    assert f.cost_quantiles() is None
    assert f.flush() is None and f.cost_quantiles() is None  # nothing to send: no figure
    carried = f.step_ns
    assert carried > 0  # ... its time is the next batch's
    engine.drive(1)
    assert f.step == 1 and f.costs_kept == 1
    p50, p99, top = f.cost_quantiles() or (0.0, 0.0, 0.0)
    assert 0 < p50 == p99 == top and top * 1000 >= carried
    assert f.flush() is None and f.cost_quantiles() == (p50, p99, top)  # not written over
    engine.drive(30)
    assert f.costs_kept == f.step > 20  # (a step of nothing to send makes no batch)
    q = f.cost_quantiles()
    assert q is not None and 0 < q[0] <= q[1] <= q[2] == f.cost_max_us
    assert f.cost_ns >= sum(f.costs[: f.step]) * 1000 * 0.999  # (the ring's µs: rounded)
    engine.rt.check()


def test_the_plugins_time_is_taken_for_one_batch_in_seven() -> None:
    """The calls' clocks are read for one batch in ``TIME_EVERY`` (7: a
    step's two batches timed in turn); the others' calls read none."""
    engine = FollowedEngine(num_blocks=64)
    f = engine.follower
    assert f.time_every == TIME_EVERY == 7
    timed_at: list[int] = []
    untimed_ns: list[int] = []
    while f.step < 50:
        before = f.step
        timed = f.timed
        engine.step()
        if f.step == before:
            continue
        if timed:
            timed_at.append(f.step)
        else:
            untimed_ns.append(f.step_ns)
    assert timed_at == [1, 8, 15, 22, 29, 36, 43, 50] and f.costs_kept == 8
    assert set(untimed_ns) == {0}  # no time taken, none carried
    q = f.cost_quantiles()
    assert q is not None and 0 < q[0] <= q[1] <= q[2]
    engine.rt.check()
