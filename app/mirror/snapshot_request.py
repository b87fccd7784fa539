"""Asking the engine for a snapshot: one request on a fresh DEALER to the
plugin's control endpoint, signed with the shared secret where there is one,
and its reply, which must be signed over the request's nonce (verified and
decoded in the decoding thread).  The client's resync is the one caller
(app/mirror/client.py).
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

import zmq
import zmq.asyncio

from app.mirror.status import MirrorStatus
from blockpool.mirror import protocol as wire
from blockpool.mirror.auth import StreamKey

SNAPSHOT_TIMEOUT_S = 30.0  # a snapshot is copied over engine steps: seconds at GPU scale
SNAPSHOT_ASK = b"snapshot?"  # what a snapshot request's mac covers, before the payload
SNAPSHOT_REPLY = b"snapshot"  # ... and a reply's, before the nonce and the payload


async def ask_snapshot(
    ctx: zmq.asyncio.Context,
    control_endpoint: str,
    key: StreamKey | None,
    status: MirrorStatus,
    decoder: ThreadPoolExecutor | None,
) -> wire.Snapshot:
    """One signed request on a fresh DEALER; the reply signed over its nonce
    (TimeoutError: none came; refused replies are counted in ``status``)."""
    st = status
    nonce = os.urandom(16)
    payload = wire.encode(wire.SnapshotRequest(reason="resync", ts=time.time(), nonce=nonce))
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.MAXMSGSIZE, wire.MAX_SNAPSHOT_BYTES)
    dealer.connect(control_endpoint)
    try:
        await dealer.send_multipart([payload, key.sign(SNAPSHOT_ASK, payload) if key else b""])
        deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            if not await dealer.poll(int(left * 1000) + 1):
                break
            frames = await dealer.recv_multipart()
            if len(frames) != 2:
                st.refused_replies += 1
                continue
            got = await open_reply(frames[0], frames[1], nonce, key, decoder)
            if got is None:
                st.refused_replies += 1
                st.problem("a snapshot reply not signed over the mirror's request: refused")
                continue
            return got
        st.snapshot_timeouts += 1
        signs = st.signed_unverified or (st.hello is not None and st.hello.authenticated)
        if key is None and signs:
            raise TimeoutError(
                f"no snapshot from {control_endpoint}: the engine signs its stream "
                "and answers signed requests only (give the mirror its secret: "
                "--mirror-token-file)"
            )
        raise TimeoutError(f"no snapshot from {control_endpoint}")
    finally:
        dealer.close(0)


async def open_reply(
    payload: bytes,
    mac: bytes,
    nonce: bytes,
    key: StreamKey | None,
    decoder: ThreadPoolExecutor | None,
) -> wire.Snapshot | None:
    """The reply verified and decoded in the decoding thread (None: refused)."""

    def open_it() -> wire.Snapshot | None:
        if key is not None and not key.verify(mac, SNAPSHOT_REPLY, nonce, payload):
            return None
        msg = wire.decode(payload, wire.MAX_SNAPSHOT_BYTES) if payload else None
        if not isinstance(msg, wire.Snapshot):
            raise wire.ProtocolError("the engine sent no snapshot")
        return msg

    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(decoder, open_it)
