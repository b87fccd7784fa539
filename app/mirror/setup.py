"""``blockpool serve --mirror ENDPOINT``: the service on a real engine's pool.

Before the service starts it waits for the engine's handshake (the plugin
re-sends it every two seconds), sizes its pool as the engine's (blocks,
block size, hash function, free order), turns off everything that would
change the pool besides the engine (demo, trace, REST mutations: 409
``read_only_mirror``), and runs a ``MirrorClient`` beside the engine task.
One service follows one engine; several engines are several services (the
observer's fleet page links them).
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from app.core.settings import Settings
from app.mirror.client import MirrorClient
from app.mirror.guard import ReadOnlyMirror
from app.mirror.routes import router
from blockpool.core.free_order import FREE_ORDERS
from blockpool.mirror.protocol import TOPIC, Hello, ProtocolError, decode

HASH_NAMES = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_MODEL_NAME = Settings.model_fields["model_name"].default


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


def wait_hello(endpoint: str, timeout_s: float) -> Hello:
    """Block until the engine's handshake arrives (MirrorStartError after timeout_s)."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.MAXMSGSIZE, 64 * 1024 * 1024)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    try:
        sub.connect(endpoint)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not sub.poll(int(min(left, 0.5) * 1000) + 1):
                continue
            frames = sub.recv_multipart()
            if len(frames) != 3 or frames[0] != TOPIC:
                continue
            try:
                msg = decode(frames[1])
            except ProtocolError:
                continue
            if isinstance(msg, Hello):
                return msg
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


def install(app: Any, endpoint: str, control_endpoint: str) -> MirrorClient:
    """Attach the mirror to an app create_app made (before it starts)."""
    client = MirrorClient(app.state.engine, endpoint, control_endpoint)
    app.state.mirror = client
    app.state.stream.follow_mirror(client.status.stream_header)
    app.state.startup_hooks.append(client.start)
    app.state.shutdown_hooks.append(client.stop)
    app.include_router(router)
    app.add_middleware(ReadOnlyMirror)
    return client
