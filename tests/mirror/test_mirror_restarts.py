"""An engine restarted is one resync; messages an earlier run left queued
are discarded, not replayed; restarted as another pool it is not followed
-- its verified handshake is handed over for a rebuild of the service, and
"restart the mirror" is said where none can follow."""

from __future__ import annotations

import msgspec
import pytest

from app.mirror import inbox as mirror_inbox
from blockpool.mirror import pool_digest
from blockpool.mirror import protocol as wire
from tests.app.conftest import running
from tests.mirror.rig import OTHER, SECRET, Rig, exact_now, gate, until

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------- restarts


async def test_an_engine_restart_is_one_resync(keyed: Rig) -> None:
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    async with running(app) as api:
        await exact_now(keyed, client)
        keyed.engine.drive(30)  # what it sent just before it went
        old = keyed.engine.follower.boot
        engine = keyed.restart()
        assert keyed.engine.follower.boot != old
        engine.drive(20)
        await until(lambda: client.boot == keyed.engine.follower.boot)
        await exact_now(keyed, client)
        st = await api.ok("GET", "/api/mirror")
        assert st["resyncs"] == 1 and st["engine_restarts"] == 1
        assert st["gaps"] == 0 and st["divergences"] == 0 and st["exact"]
        await until(lambda: client.status.hello.boot == keyed.engine.follower.boot)  # its handshake
    assert pool_digest(app.state.engine.pool) == pool_digest(engine.rt.pool)


async def test_queued_messages_of_an_old_boot_are_discarded_not_replayed(
    keyed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of the engine that went, still queued when the mirror resyncs
    from the new engine's snapshot, are dropped unread (43bd10b applied them
    one by one: a gap and a resync each)."""
    monkeypatch.setattr(mirror_inbox, "GROUP_MAX", 1)  # one message per writer call
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    async with running(app) as api:
        await exact_now(keyed, client)
        go = gate(client, monkeypatch)
        keyed.engine.drive(2)
        keyed.engine.accept = False  # a batch lost: the first thing after the gate is a gap
        keyed.engine.drive(1)
        keyed.engine.accept = True
        f = keyed.engine.follower
        await until(lambda: keyed.sender.handled_seq == f.seq - 1)  # (the lost one never queued)
        bundles = keyed.sender.bundles
        for _ in range(20):  # queued behind the gap, a message each (none bundled)
            keyed.engine.drive(1)
            await until(lambda: keyed.sender.handled_seq == f.seq)
        assert keyed.sender.bundles == bundles
        engine = keyed.restart()

        def heard_the_new_engine() -> bool:  # (the SUB reconnects to it: not at once)
            engine.drive(1)
            boots = {wire.decode(frames[1]).boot for frames, _, _ in client.inbox.frames}
            return keyed.engine.follower.boot in boots

        await until(heard_the_new_engine)
        go.set()
        await until(lambda: client.boot == keyed.engine.follower.boot)
        await exact_now(keyed, client)
        st = await api.ok("GET", "/api/mirror")
        assert st["resyncs"] == 1 and st["gaps"] == 1 and st["divergences"] == 0
        assert st["stale_discarded"] >= 10 and st["engine_restarts"] == 1
    assert pool_digest(app.state.engine.pool) == pool_digest(engine.rt.pool)


async def test_an_engine_restarted_as_another_pool_is_not_followed(keyed: Rig) -> None:
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    async with running(app) as api:
        await exact_now(keyed, client)
        resyncs = client.status.resyncs
        engine = keyed.restart(num_blocks=32)
        await until(lambda: client.status.shape_problem is not None)
        seen = client.status.messages
        engine.drive(10)
        await until(lambda: client.status.messages >= seen + 10)  # it went on listening
        st = await api.ok("GET", "/api/mirror")
        assert not st["exact"] and st["state"] == "restart_needed"
        assert "restarted with 32 blocks" in st["problem"] and "restart the mirror" in st["problem"]
        assert st["resyncs"] == resyncs and st["resync_failures"] == 0
        assert keyed.sender.snapshots == 0  # no snapshot asked of a pool it cannot hold
        assert st["engine"]["num_gpu_blocks"] == 32 and st["engine_restarts"] == 1
        assert app.state.engine.pool.num_gpu_blocks == 64
    app.state.engine.check()


async def test_an_engine_restarted_as_another_pool_asks_a_rebuild_with_its_handshake(
    keyed: Rig,
) -> None:
    """``serve`` rebuilds the service from the handshake handed to ``rebuild``:
    the new run's, verified with the secret (a stranger's, of any size, never),
    and no snapshot is asked of a pool the service cannot hold."""
    hello = await keyed.hello()
    asked: list[wire.Hello] = []
    app, client = keyed.service(hello, rebuild=asked.append)
    async with running(app) as api:
        await exact_now(keyed, client)
        keyed.key = OTHER  # a run of another engine, not signed with the mirror's secret
        stranger = keyed.restart(num_blocks=96)
        refused = client.status.unauthenticated

        def refusing() -> bool:
            stranger.drive(1)
            return client.status.unauthenticated >= refused + 10

        await until(refusing)
        assert (
            asked == []
            and client.service_rebuild.rebuild_for is None
            and client.status.shape_problem is None
        )
        keyed.key = SECRET
        engine = keyed.restart(num_blocks=96)
        await until(lambda: asked)
        new = asked[-1]
        assert new.num_gpu_blocks == 96 and new.authenticated
        assert new.boot == engine.follower.boot == client.boot
        assert client.service_rebuild.rebuild_for == new
        seen = client.status.messages
        engine.drive(10)
        await until(lambda: client.status.messages >= seen + 10)  # it went on listening
        st = await api.ok("GET", "/api/mirror")
        assert not st["exact"] and st["state"] == "rebuilding" and st["rebuilds"] == 0
        assert "restarted with 96 blocks" in st["problem"]
        assert "rebuilding the service" in st["problem"]
        assert st["resync_failures"] == 0 and keyed.sender.snapshots == 0
        assert all(h.num_gpu_blocks == 96 and h.boot == new.boot for h in asked)
        assert app.state.engine.pool.num_gpu_blocks == 64  # this service is not resized
    app.state.engine.check()


async def test_no_rebuild_for_the_handshake_the_service_was_built_from(keyed: Rig) -> None:
    """A handshake the service was built from but does not match (a hash it
    cannot take, so built with its own) asks no rebuild: the same service
    would be built again, and again."""
    hello = await keyed.hello()
    asked: list[wire.Hello] = []
    odd = msgspec.structs.replace(hello, hash_fn="md5")
    app, client = keyed.service(odd, rebuild=asked.append)
    st = client.status.as_dict()
    assert st["state"] == "restart_needed" and "restart the mirror" in st["problem"]
    assert asked == [] and client.service_rebuild.rebuild_for is None
    app.state.engine.check()
