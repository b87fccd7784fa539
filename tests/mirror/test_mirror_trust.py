"""``serve --mirror`` fit for a production engine: only the engine is the
engine (a shared secret: a forged publisher, another secret, a signed stream
taken unverified without one), large messages are read off the event loop,
the request book is bounded in bytes.

The engine side is tests/mirror/fake_engine.py (the wire contract: signed
PUB frames, a ROUTER answering signed snapshot requests).  Exactness:
tests/mirror/test_mirror_exactness.py; restarts: test_mirror_restarts.py.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from typing import Any

import anyio
import pytest

from app.cli import parser
from app.cli.settings import settings_from
from app.main import create_app
from app.mirror import setup as mirror_setup
from app.mirror.request_book import RequestBook
from blockpool.mirror import pool_digest
from blockpool.mirror import protocol as wire
from tests.app.conftest import free_port, make_settings, running
from tests.mirror.fake_engine import forged_stream
from tests.mirror.rig import OTHER, SECRET, Rig, exact_now, metric, until

pytestmark = pytest.mark.anyio


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
