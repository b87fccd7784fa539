"""Driving the e2e server's pool over REST: the demo on and off, a request
admitted and finished by hand, every cached hash evicted."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import Server, wait_for


def start_demo(server: Server, rate: float = 20.0) -> None:
    assert server.post("/api/demo/config", {"rate": rate}).status_code == 200
    assert server.post("/api/demo/start").status_code == 200


def demo_finished(server: Server) -> int:
    """How many requests the demo has finished so far."""
    return int(server.get("/api/demo")["stats"]["finished"])


def run_demo(server: Server, finished: int = 8, rate: float = 20.0) -> None:
    """The demo on until it has finished ``finished`` more requests (their
    blocks cached, later ones' in use); it keeps running."""
    before = demo_finished(server)
    start_demo(server, rate)
    wait_for(
        lambda: demo_finished(server) >= before + finished,
        what=f"the demo to finish {finished} requests",
    )


def quiesce(server: Server) -> None:
    """Stop the demo (its running requests finish): the pool stops changing."""
    r = server.post("/api/demo/stop")
    assert r.status_code == 200, r.text


def quiesce_idle(server: Server) -> None:
    """``quiesce``, then no request is running at all."""
    quiesce(server)
    wait_for(lambda: server.get("/api/summary")["running_requests"] == 0, what="requests to end")


def quiet_moment(server: Server) -> int:
    """``quiesce_idle``, then the last op the recording holds: a moment of
    the quiet pool to come back to (time travel)."""
    quiesce_idle(server)
    return int(server.get("/api/history")["last_seq"])


def admit(server: Server, tokens: list[int], rid: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"token_ids": tokens}
    if rid:
        body["request_id"] = rid
    r = server.post("/api/requests", body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def finish(server: Server, rid: str) -> None:
    assert server.post(f"/api/requests/{rid}/finish").status_code == 200


def evict_everything(server: Server) -> None:
    """Take every free block through the raw block API and give them back:
    the cached hashes are evicted (the next admission of a prompt misses
    them as ``evicted`` and storing them again is a regret)."""
    free = server.get("/api/summary")["num_free_blocks"]
    r = server.post("/api/pool/allocate", {"num_blocks": free})
    assert r.status_code == 200, r.text
    ids = r.json()["block_ids"]
    assert server.post("/api/pool/free", {"block_ids": ids}).status_code == 200
