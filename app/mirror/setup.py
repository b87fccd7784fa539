"""``blockpool serve --mirror ENDPOINT``: the service on a real engine's pool.

Before the service starts it waits for the engine's handshake (the plugin
re-sends it every two seconds), sizes its pool as the engine's (blocks,
block size, hash function, free order), turns off everything that would
change the pool besides the engine (demo, trace, REST mutations: 409
``read_only_mirror``), and runs a ``MirrorClient`` beside the engine task.
One service follows one engine; several engines are several services (the
observer's fleet page links them).

With a shared secret (``--mirror-token-file``) the handshake must be signed
with it too: a Hello from anyone else (whoever bound the port first) is
refused and cannot size the service.

An engine restarted as another pool is followed by a rebuild: the client
hands its new handshake to ``rebuild`` (``install``), and ``serve`` stops
the service in order and builds it again from that handshake, in the same
process, on the same port (at most once per ``REBUILD_MIN_S``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq
from fastapi import FastAPI

from app.analysis.shadows import MirrorShadows
from app.mirror.client import MirrorClient
from app.mirror.guard import ReadOnlyMirror
from app.mirror.request_book import running_page
from app.mirror.routes import router
from app.mirror.status import REFUSED_WHY, figures_of
from app.shared.settings import Settings
from blockpool.core.free_order import FREE_ORDERS
from blockpool.mirror.auth import SecretError, StreamKey
from blockpool.mirror.protocol import MAX_BATCH_BYTES, TOPIC, Hello, ProtocolError, decode
from blockpool.mirror.traffic import engine_facts, request_lines

HASH_NAMES = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_MODEL_NAME = Settings.model_fields["model_name"].default
# figures a mirror cannot know (Engine.unknown): the views say them null, with this
UNKNOWN = {
    "tokens": "a mirror is told the engine's blocks, not its tokens: how full its "
    "partial blocks are is not known here",
    "request_owners": "a mirror is told block operations without the request that made "
    "them: whose block was evicted is not known here",
}
REBUILD_MIN_S = 5.0  # a service is rebuilt at most once in this long (an engine flapping)


class MirrorStartError(RuntimeError):
    """No handshake from the engine, or one the service cannot follow."""


def check_endpoint(endpoint: str) -> str:
    head, _, port = endpoint.rpartition(":")
    if not head.startswith("tcp://") or not port.isdigit() or not 0 < int(port) < 65535:
        raise MirrorStartError(f"--mirror takes tcp://HOST:PORT, got {endpoint!r}")
    return endpoint


def control_for(endpoint: str, hello: Hello) -> str:
    """The engine's snapshot endpoint: the PUB host, the port it announced."""
    head, _, port = endpoint.rpartition(":")
    cport = hello.control_port if hello.control_port else int(port) + 1
    return f"{head}:{cport}"


def read_key(path: str | None) -> StreamKey | None:
    """The shared secret from ``--mirror-token-file`` (None: none given)."""
    if path is None:
        return None
    try:
        return StreamKey.from_file(path)
    except SecretError as exc:
        raise MirrorStartError(f"--mirror-token-file: {exc}") from None


def wait_hello(endpoint: str, timeout_s: float, key: StreamKey | None = None) -> Hello:
    """Block until the engine's handshake arrives (MirrorStartError after
    timeout_s); with ``key``, only one signed with it."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    refused = 0
    try:
        sub.connect(endpoint)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not sub.poll(int(min(left, 0.5) * 1000) + 1):
                continue
            frames = sub.recv_multipart()
            if len(frames) != 3 or frames[0] != TOPIC:
                continue
            if key is not None and not key.verify(frames[2], TOPIC, frames[1]):
                refused += 1  # not decoded
                continue
            try:
                msg = decode(frames[1], MAX_BATCH_BYTES)
            except ProtocolError:
                continue
            if isinstance(msg, Hello):
                return msg
        if refused:
            raise MirrorStartError(
                f"no signed handshake on {endpoint} in {timeout_s:g} s: {refused} "
                f"messages refused; {REFUSED_WHY}"
            )
        raise MirrorStartError(
            f"no handshake from an engine on {endpoint} in {timeout_s:g} s (is vLLM running "
            "with --scheduler-cls blockpool_vllm.scheduler.MirrorScheduler and "
            "BLOCKPOOL_MIRROR_ENDPOINT set to that address?)"
        )
    finally:
        sub.close(0)
        ctx.term()


def settings_for(hello: Hello, settings: Settings) -> Settings:
    """The service's settings shaped as the engine's pool, read only."""
    update: dict[str, Any] = {
        "num_blocks": hello.num_gpu_blocks,
        "memory_budget_bytes": None,
        "block_size": hello.block_size,
        "num_groups": max(1, len(hello.groups)),
        "demo": False,
        "trace": None,
        "storage": False,
        "enable_caching": True,
        "enable_events": True,
    }
    if settings.model_name == DEFAULT_MODEL_NAME:  # --model-name, where given, stays
        update["model_name"] = hello.model or "vllm-mirror"
    if hello.hash_fn in HASH_NAMES:
        update["hash_fn"] = hello.hash_fn
    if hello.free_order in FREE_ORDERS:
        update["free_order"] = hello.free_order
    return settings.model_copy(update=update)


def install(
    app: FastAPI,
    endpoint: str,
    control_endpoint: str,
    key: StreamKey | None = None,
    hello: Hello | None = None,
    rebuild: Callable[[Hello], None] | None = None,
    rebuilds: int = 0,
) -> MirrorClient:
    """Attach the mirror to an app create_app made (before it starts);
    ``hello``: the handshake that sized it (the first snapshot is asked at once);
    ``rebuild``: told the engine's new handshake when it restarted as another
    pool (None: the status says to restart the mirror); ``rebuilds``: the
    services rebuilt before this one."""
    s = app.state.settings
    client = MirrorClient(
        app.state.engine,
        endpoint,
        control_endpoint,
        key=key,
        hello=hello,
        max_lag_s=s.mirror_max_lag_s,
        max_backlog=s.mirror_max_backlog,
        rebuild=rebuild,
        rebuilds=rebuilds,
    )
    app.state.mirror = client
    if hello is not None:
        _what_if_and_export(app, client, hello)
    app.state.stream.follow_mirror(client.status.stream_header)
    app.state.metrics_sources["mirror"] = figures_of(client.status)
    app.state.metrics_collector.mirror = True  # no vLLM name beside the engine's own
    engine = app.state.engine
    engine.request_counts = client.queues.counts  # the engine's requests, or None
    engine.request_history = client.queues
    engine.unknown.update(UNKNOWN)
    queues, book, bs = client.queues, client.book, engine.settings.block_size

    def listing(offset: int, limit: int) -> dict[str, Any]:
        known = queues.counts()["running"] is not None
        return running_page(book, queues.running_ids() if known else None, bs, offset, limit)

    engine.request_listing = listing
    app.state.startup_hooks.append(client.start)
    app.state.shutdown_hooks.append(client.stop)
    app.include_router(router)
    app.add_middleware(ReadOnlyMirror)
    return client


def _what_if_and_export(app: FastAPI, client: MirrorClient, hello: Hello) -> None:
    """The shadows fed from the engine's requests in its free order, and
    the export told what the engine is and what it served."""
    s = app.state.settings
    analysis = app.state.engine.analysis
    if analysis is None:
        return
    facts = engine_facts(hello)
    tokens_per_id = hello.hash_block_size
    if analysis.recorder is not None:
        analysis.recorder.describe_engine(
            facts, lambda since: request_lines(client.traffic, tokens_per_id, since)
        )
    if s.shadow_mode != "off" and s.enable_caching:
        order = hello.free_order if hello.free_order in FREE_ORDERS else s.free_order
        shadows = MirrorShadows(s, order, f"vLLM {hello.vllm_version}")
        analysis.show_mirror_shadows(shadows)
        client.feed_shadows(shadows.feed)
