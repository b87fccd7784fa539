"""``serve --mirror`` fit for a production engine: only the engine is the
engine (a shared secret), ``exact`` means exact now (a digest since the
snapshot, not stale, not behind), an engine restarted is one resync (or,
restarted as another pool, its verified handshake handed over for a rebuild
of the service; "restart the mirror" where none can follow), a backlog is bounded,
large messages are read off the event loop, the request book is bounded in
bytes.

The engine side is tests/mirror/fake_engine.py (the wire contract: signed
PUB frames, a ROUTER answering signed snapshot requests).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import msgspec
import pytest

from app.cli import parser
from app.cli.settings import settings_from
from app.main import create_app
from app.mirror import client as mirror_client
from app.mirror import inbox as mirror_inbox
from app.mirror import setup as mirror_setup
from app.mirror import snapshot_request as mirror_snapshot_request
from app.mirror import status as mirror_status
from app.mirror.client import MirrorClient
from app.mirror.request_book import RequestBook
from blockpool.mirror import pool_digest
from blockpool.mirror import protocol as wire
from blockpool.mirror.auth import StreamKey
from tests.app.conftest import free_port, make_settings, running
from tests.mirror.fake_engine import forged_stream
from tests.mirror.rig import Rig, metric, until

pytestmark = pytest.mark.anyio

SECRET = StreamKey(b"the engine's secret, 32 chars ok")
OTHER = StreamKey(b"another secret, 32 characters ok")


@pytest.fixture
async def keyed() -> AsyncIterator[Rig]:
    """An engine and a mirror sharing one secret."""
    r = Rig("uncached_first", key=SECRET)
    r.start()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def quick_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine that does not answer is given up on soon (and retried soon)."""
    monkeypatch.setattr(mirror_snapshot_request, "SNAPSHOT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(mirror_client, "RETRY_S", 0.2)
    monkeypatch.setattr(mirror_client, "RETRY_MAX_S", 0.5)


def gate(client: MirrorClient, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Hold the mirror's processor before it handles its next group (the
    reader goes on taking frames): set the event to let it go."""
    go = asyncio.Event()
    handle: Callable[[Any], Awaitable[None]] = client._handle_group

    async def held(opened: Any) -> None:
        await go.wait()
        await handle(opened)

    monkeypatch.setattr(client, "_handle_group", held)
    return go


async def exact_now(rig: Rig, client: MirrorClient) -> None:
    """Drive the engine until the mirror caught up and a digest matched since its sync."""

    def proved() -> bool:
        if not (rig.caught_up(client) and client.status.digests_checked_since_sync > 0):
            rig.engine.drive(1)
            return False
        return True

    await until(proved)
    await until(lambda: client.status.as_dict()["exact"])


# ------------------------------------------------------------------ the secret


async def test_a_forged_publisher_on_the_endpoint_is_refused(quick_resync: None) -> None:  # noqa: ARG001 fixture used for its side effect
    """Whoever bound the mirror's endpoint first (no secret, or not the
    engine's) cannot size the service, change its pool or be called exact."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    control = f"tcp://127.0.0.1:{free_port()}"
    forger = forged_stream(endpoint, control, None)  # it answers every snapshot request
    forger.start()
    try:
        with pytest.raises(mirror_setup.MirrorStartError, match="not signed with the mirror"):
            await anyio.to_thread.run_sync(mirror_setup.wait_hello, endpoint, 1.5, SECRET)
        hello = forger.hello()  # the handshake the real engine would have sent
        app = create_app(mirror_setup.settings_for(hello, make_settings()))
        client = mirror_setup.install(app, endpoint, control, SECRET, hello)
        fresh = pool_digest(app.state.engine.pool)
        async with running(app) as api:
            forger.engine.drive(10)
            await until(lambda: client.status.unauthenticated >= 10)
            await until(lambda: client.status.refused_replies >= 1)
            forger.engine.drive(5)
            st = await api.ok("GET", "/api/mirror")
            assert st["peer"] == "refused" and st["state"] == "refused"
            assert not st["exact"] and not st["synced"] and st["authenticated"]
            assert "not signed with the mirror's secret" in st["last_problem"]
            assert st["batches"] == 0 and st["messages"] == 0 and st["resyncs"] == 0
            assert pool_digest(app.state.engine.pool) == fresh  # nothing of it applied
            text = (await api.get("/metrics")).text
            assert metric(text, "blockpool_mirror_exact") == 0
            assert metric(text, "blockpool_mirror_unauthenticated_total") >= 10
        app.state.engine.check()
    finally:
        forger.close()


async def test_an_engine_with_another_secret_is_refused_both_ways(quick_resync: None) -> None:  # noqa: ARG001 fixture used for its side effect
    rig = Rig("append_all", key=OTHER, mirror_key=SECRET)
    rig.start()
    try:
        with pytest.raises(mirror_setup.MirrorStartError, match="refused"):
            await anyio.to_thread.run_sync(mirror_setup.wait_hello, rig.endpoint, 10.0, SECRET)
        app, client = rig.service(rig.sender.hello())
        async with running(app) as api:
            rig.engine.drive(5)
            await until(lambda: client.status.snapshot_timeouts >= 1)
            await until(lambda: client.status.unauthenticated >= 5)
            assert rig.sender.bad_requests >= 1 and rig.sender.snapshots == 0  # it answered nothing
            st = await api.ok("GET", "/api/mirror")
            assert not st["exact"] and not st["synced"] and st["peer"] == "refused"
            assert st["messages"] == 0 and st["resync_failures"] >= 1
    finally:
        rig.close()


async def test_a_mirror_without_the_secret_takes_a_signed_stream_unverified(
    quick_resync: None,  # noqa: ARG001 fixture used for its side effect
) -> None:
    """It reads what a keyed engine says (authenticated: false), but the
    engine answers signed snapshot requests only: never synced, never exact,
    and it says why."""
    rig = Rig("append_all", key=SECRET)
    rig.mirror_key = None
    rig.start()
    try:
        hello = await rig.hello()
        assert hello.authenticated
        app, client = rig.service(hello)
        async with running(app) as api:
            rig.engine.drive(5)
            # (what the engine published before the mirror's subscription took
            # is not delivered: the handshakes and beats that follow are)
            await until(
                lambda: client.status.snapshot_timeouts >= 1 and client.status.signed_unverified > 0
            )
            st = await api.ok("GET", "/api/mirror")
            assert st["authenticated"] is False and st["signed_unverified"] > 0
            assert st["peer"] == "engine" and st["unauthenticated"] == 0
            assert not st["synced"] and not st["exact"]
            assert "--mirror-token-file" in st["last_problem"]
    finally:
        rig.close()


async def test_a_keyed_mirror_follows_a_keyed_engine_exactly(keyed: Rig) -> None:
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    async with running(app) as api:
        await exact_now(keyed, client)
        await keyed.drive(client, 10, 3)
        assert pool_digest(app.state.engine.pool) == pool_digest(keyed.engine.rt.pool)
        st = await api.ok("GET", "/api/mirror")
        assert st["exact"] and st["authenticated"] and st["unauthenticated"] == 0
    app.state.engine.check()


def test_the_secret_is_a_file_given_by_flag_or_environment(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "secret"
    path.write_text("s3cret-s3cret-s3cret-s3cret\n")
    args = parser().parse_args(["serve", "--mirror-token-file", str(path)])
    assert settings_from(args).mirror_token_file == str(path)
    monkeypatch.setenv("BLOCKPOOL_MIRROR_TOKEN_FILE", str(path))
    assert settings_from(parser().parse_args(["serve"])).mirror_token_file == str(path)
    key = mirror_setup.read_key(str(path))
    assert key is not None and "s3cret" not in repr(key)
    path.write_text("short\n")
    with pytest.raises(mirror_setup.MirrorStartError, match="at least 16") as err:
        mirror_setup.read_key(str(path))
    assert "short" not in str(err.value)  # never the secret itself


# --------------------------------------------------------- exact means exact now


async def test_exact_only_after_the_first_digest_since_the_snapshot(keyed: Rig) -> None:
    keyed.engine.drive(7)  # a start mid-run, then the engine idle: no digest comes
    while keyed.engine.follower.step % 3 == 0:  # (its last batch carries none either)
        keyed.engine.drive(1)
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    async with running(app) as api:
        await until(lambda: client.status.syncs == 1)
        st = await api.ok("GET", "/api/mirror")
        assert st["synced"] and not st["exact"] and st["state"] == "synced"
        assert st["digests_checked_since_sync"] == 0
        assert st["seconds_since_digest"] is None and st["ops_since_digest"] is None
        await exact_now(keyed, client)
        st = await api.ok("GET", "/api/mirror")
        assert st["exact"] and st["state"] == "exact" and st["digests_checked_since_sync"] >= 1
        assert 0 <= st["seconds_since_digest"] < 60
        assert 0 <= st["ops_since_digest"] <= st["ops_applied"]


def test_the_status_says_how_old_the_last_matching_digest_is() -> None:
    """``exact`` rests on the last digest that matched: /api/mirror says how
    many seconds and operations ago (not known -- None -- since a sync until
    one matches), so an engine whose plugin sends fewer shows it."""
    st = mirror_status.MirrorStatus("tcp://e", "tcp://c")
    st.resynced(1)
    st.ops_applied = 40
    d = st.as_dict()
    assert d["seconds_since_digest"] is None and d["ops_since_digest"] is None
    st.digest_matched()
    st.ops_applied += 25  # batches applied since, none with a digest
    d = st.as_dict()
    assert d["ops_since_digest"] == 25 and 0 <= d["seconds_since_digest"] < 60
    assert d["digests_checked"] == d["digests_checked_since_sync"] == 1
    st.last_digest_at = time.monotonic() - 30.0
    assert 29.0 <= st.as_dict()["seconds_since_digest"] < 60
    st.lost()  # a resync due: no digest since the sync it leads to
    assert st.as_dict()["ops_since_digest"] is None
    st.resynced(9)
    st.digest_matched()
    assert st.as_dict()["ops_since_digest"] == 0


async def test_a_silent_engine_is_not_exact_at_once_everywhere(
    keyed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror_status, "STALE_AFTER_S", 1.0)
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    hub = app.state.stream
    async with running(app) as api:
        await exact_now(keyed, client)
        assert hub.mirror_now()["exact"]
        assert metric((await api.get("/metrics")).text, "blockpool_mirror_exact") == 1
        keyed.close()  # the engine is gone: nothing marks the status, it is read so
        await until(lambda: client.status.stale)
        st = await api.ok("GET", "/api/mirror")
        assert st["stale"] and not st["exact"] and st["state"] == "stale"
        header = hub.mirror_now()
        assert header["exact"] is False and header["state"] == "stale"
        text = (await api.get("/metrics")).text
        assert metric(text, "blockpool_mirror_exact") == 0
        assert metric(text, "blockpool_mirror_stale") == 1


async def test_a_mirror_behind_says_so_with_its_backlog(
    keyed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    hello = await keyed.hello()
    app, client = keyed.service(hello, mirror_max_lag_s=0.3)
    async with running(app) as api:
        await exact_now(keyed, client)
        before = await api.ok("GET", "/api/mirror")
        go = gate(client, monkeypatch)
        for _ in range(40):
            keyed.engine.drive(1)
            await anyio.sleep(0)
        await until(lambda: client.status.as_dict()["behind"])
        st = await api.ok("GET", "/api/mirror")
        assert st["behind"] and not st["exact"] and st["state"] == "behind"
        assert st["backlog"] >= 1 and st["backlog_ms"] > 300
        assert metric((await api.get("/metrics")).text, "blockpool_mirror_behind") == 1
        await until(lambda: client.status.backlog()[0] >= 30)
        go.set()
        await exact_now(keyed, client)
        st = await api.ok("GET", "/api/mirror")
        assert st["exact"] and not st["behind"] and st["backlog"] == 0
        # the backlog went to the writer in groups, each batch checked
        batches = st["batches"] - before["batches"]
        assert batches >= 30 and st["writer_calls"] - before["writer_calls"] < batches
        assert st["gaps"] == 0 and st["divergences"] == 0 and st["resyncs"] == 0
    assert pool_digest(app.state.engine.pool) == pool_digest(keyed.engine.rt.pool)


async def test_a_backlog_past_its_bound_is_dropped_for_one_snapshot(
    keyed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    hello = await keyed.hello()
    app, client = keyed.service(hello, mirror_max_backlog=10)
    async with running(app) as api:
        await exact_now(keyed, client)
        go = gate(client, monkeypatch)
        for _ in range(40):
            keyed.engine.drive(1)
            await anyio.sleep(0)
        await until(lambda: client.status.backlog_dropped >= 20)
        assert len(client.inbox.frames) <= 10  # never held past its bound
        go.set()
        await exact_now(keyed, client)
        st = await api.ok("GET", "/api/mirror")
        assert st["resyncs"] == 1 and st["exact"]  # one snapshot for the whole backlog
        text = (await api.get("/metrics")).text
        assert metric(text, "blockpool_mirror_backlog_dropped_total") == st["backlog_dropped"]
    assert pool_digest(app.state.engine.pool) == pool_digest(keyed.engine.rt.pool)


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
        keyed.engine.drive(20)  # queued behind the gap
        await until(lambda: keyed.sender._queue.empty())
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


# ------------------------------------------------------ off the loop, bounded


async def test_a_large_message_is_decoded_off_the_event_loop(
    keyed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a 5 MB batch is decoded, /api/health answers."""
    hello = await keyed.hello()
    app, client = keyed.service(hello)
    real = wire.decode
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def decode(data: bytes, limit: int = wire.MAX_MESSAGE_BYTES) -> wire.Message:
        if len(data) > 4_000_000:
            started.set()
            if not release.wait(30):  # (a loop held here cannot release it)
                order.append("not released")
            order.append("decoded")
        return real(data, limit)

    async with running(app) as api:
        await exact_now(keyed, client)
        monkeypatch.setattr(wire, "decode", decode)
        hashes = [os.urandom(32) for _ in range(5 * 1024 * 1024 // 34)]
        keyed.engine.follower.request(wire.Arrive("big", time.time(), len(hashes) * 4, hashes))
        keyed.engine.drive(1)
        await until(started.is_set)
        health = await api.get("/api/health")
        assert health.status_code == 200
        order.append("health")
        release.set()
        await until(lambda: "big" in client.book.requests and keyed.caught_up(client))
        assert order == ["health", "decoded"]
        assert client.book.requests["big"]["num_blocks"] == len(hashes)


def test_the_request_book_is_bounded_in_bytes() -> None:
    """Records with the largest hashes the protocol admits, forged by the
    hundred: the book stays within its byte budget, the newest kept."""
    budget = 4 * 1024 * 1024
    book = RequestBook(max_bytes=budget)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(100):
            hashes = [os.urandom(64) for _ in range(4096)]  # 64-byte hashes, 4096 kept
            book.apply([wire.Arrive(f"r{i}", 1.0, 4096 * 16, hashes)], seq=i)
            assert book.bytes <= budget
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held < 2 * budget, held  # what it holds, measured, not only counted
    assert "r99" in book.requests and "r0" not in book.requests
    assert book.dropped > 0 and len(book.requests) < 20
