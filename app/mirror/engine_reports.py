"""What the engine's plugin says of itself, onto the mirror's status.

Its handshake (``Hello``: the engine, its pool, its protocol, whether it can
be followed exactly) and its beats (``Beat``: drops, steps, what following
costs it, how its digest reading goes) are recorded on ``MirrorStatus`` as
they come.  What they mean for following the engine -- a pool of another
shape, a runtime behind the engine's operations -- the client decides
(app/mirror/client.py).
"""

from __future__ import annotations

import logging

from app.mirror.status import MirrorStatus
from blockpool.mirror import protocol as wire

logger = logging.getLogger("blockpool.mirror")


class EngineReports:
    def __init__(self, status: MirrorStatus) -> None:
        self.status = status
        self._newer_said = 0  # a newer protocol the handshake said (said once)

    def heard_hello(self, hello: wire.Hello) -> bool:
        """The handshake's figures recorded; whether it is the first heard."""
        st = self.status
        first = st.hello is None
        st.hello = hello
        if hello.cost_us is not None:
            st.engine_cost_us = hello.cost_us
        if hello.reading is not None:
            st.engine_reading = hello.reading
        return first

    def hello_said(self, hello: wire.Hello, first: bool) -> None:
        """What the handshake says of following the engine: exactly or not, a
        newer protocol (a problem, said once), and the engine, logged when first."""
        st = self.status
        st.unsupported = not hello.exact
        if hello.protocol > wire.PROTOCOL and hello.protocol != self._newer_said:
            self._newer_said = hello.protocol
            why = (
                f"the engine's plugin speaks protocol {hello.protocol}, this mirror "
                f"{wire.PROTOCOL}: what it cannot read is counted as bad messages "
                "(install the same blockpool on both sides)"
            )
            st.problem(why)
            logger.warning("mirror: %s", why)
        if first:
            logger.info(
                "mirror: engine %s (vLLM %s, %d blocks, %s)%s",
                hello.engine_id,
                hello.vllm_version,
                hello.num_gpu_blocks,
                hello.free_order,
                "" if hello.exact else " NOT exact: " + "; ".join(hello.problems),
            )

    def heard_beat(self, beat: wire.Beat) -> None:
        """A beat's figures recorded: the engine's drops, steps and costs."""
        st = self.status
        st.engine_drops = beat.drops
        st.engine_steps, st.engine_cost_ns = beat.steps, beat.cost_ns
        if beat.cost_us is not None:
            st.engine_cost_us = beat.cost_us
        if beat.reading is not None:
            st.engine_reading = beat.reading
