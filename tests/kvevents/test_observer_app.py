"""The observer's REST views, websocket, metrics and auth, against a real
uvicorn server following two scripted publishers."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import pytest
import websockets
from fastapi import FastAPI

from blockpool import BlockStored
from blockpool.kvevents.hashes import hash_hex
from tests.kvevents.helpers import (
    FakePublisher,
    Workload,
    await_for,
    fake_publisher,
    map_tagged,
    positional,
    truth,
)
from tests.kvevents.observer_live import client, live_observer, ws_ticks


async def _first_message(url: str, subprotocols: list[str] | None = None) -> None:
    """Connect and read one message (the refusals raise)."""
    async with websockets.connect(url, subprotocols=subprotocols) as ws:  # type: ignore[arg-type]
        await ws.recv()


async def feed(app: FastAPI, fps: dict[str, FakePublisher], batches: dict[str, list[Any]]) -> None:
    fleet = app.state.fleet
    await await_for(lambda: all(s.connected for s in fleet.sources.values()))
    for fp in fps.values():
        await asyncio.to_thread(fp.wait_subscribed)
    for name, fp in fps.items():
        enc = positional if name == "a" else map_tagged
        for i, evs in enumerate(batches[name]):
            fp.send(i, enc(evs))
    for name, evs in batches.items():
        s, last = fleet.sources[name], len(evs) - 1
        await await_for(lambda s=s, last=last: s.tracker.applied == last, what=f"{name} fed")


def test_rest_views_metrics_and_websocket() -> None:
    wa, wb = Workload(seed=71, lora=False), Workload(seed=72, lora=False)
    wb.prefixes = wa.prefixes
    batches = {"a": wa.batches(60), "b": wb.batches(40)}

    async def main() -> None:
        with fake_publisher() as fa, fake_publisher() as fb:
            endpoints = [f"a={fa.endpoint}", f"b={fb.endpoint}"]
            replays = [fa.replay_endpoint, "none"]
            async with (
                live_observer(endpoints=endpoints, replay_endpoints=replays) as app,
                client(app) as h,
            ):
                ws_url = f"ws://127.0.0.1:{app.state.port}/api/fleet/stream"
                async with websockets.connect(ws_url) as ws:
                    hello = json.loads(await ws.recv())
                    assert hello["type"] == "hello"
                    assert [i["name"] for i in hello["instances"]] == ["a", "b"]
                    await feed(app, {"a": fa, "b": fb}, batches)
                    ticks = await ws_ticks(ws, until=lambda m: m["instances"][1]["last_seq"] == 39)
                seqs = [m["seq"] for m in ticks]
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
                seen = [e for m in ticks for e in m["events"]]
                total = sum(len(b) for bs in batches.values() for b in bs)
                assert len(seen) + sum(m["events_omitted"] for m in ticks) == total
                assert {e["instance"] for e in seen} == {"a", "b"}

                await check_rest(h, batches)
                metrics = (await h.get("/metrics")).text
                assert 'blockpool_observer_connected{pool="a"} 1.0' in metrics
                assert 'blockpool_observer_exact{pool="b"} 1.0' in metrics
                assert 'blockpool_observer_batches_total{pool="a"} 60.0' in metrics
                assert "blockpool_observer_gaps_total" in metrics
                assert "blockpool_observer_replay_failures_total" in metrics
        wa.check()
        wb.check()

    asyncio.run(main())


async def check_rest(h: httpx.AsyncClient, batches: dict[str, list[Any]]) -> None:
    assert (await h.get("/api/health")).json()["connected"] == 2
    fleet = (await h.get("/api/fleet")).json()
    assert fleet["role"] == "observer"
    assert any("block ids" in line for line in fleet["cannot_know"])
    a = next(i for i in fleet["instances"] if i["name"] == "a")
    want = truth(batches["a"])
    assert (a["keys"], a["blocks"], a["exact"], a["last_seq"]) == (
        len(want), sum(want.values()), True, 59,
    )  # fmt: skip
    assert a["events"] == sum(len(b) for b in batches["a"]) == sum(a["event_counts"].values())
    assert (await h.get("/api/fleet/b")).json()["encodings"] == {"map": 40}
    assert (await h.get("/api/fleet/nope")).status_code == 404

    # the hash map, paged: the pages together are the whole map
    got: dict[str, int] = {}
    offset = 0
    while True:
        page = (await h.get("/api/fleet/a/hashmap", params={"offset": offset, "limit": 7})).json()
        assert page["total_keys"] == len(want) and page["matched"] == len(want)
        got.update({item["hash"]: item["copies"] for item in page["items"]})
        offset += 7
        if offset >= page["matched"]:
            break
    assert got == {hash_hex(k): v for k, v in want.items()}
    first = next(iter(want))
    for q in (hash_hex(first)[:10], str(first)[:12], hash_hex(first)):
        found = (await h.get("/api/fleet/a/hashmap", params={"q": q})).json()
        assert hash_hex(first) in [i["hash"] for i in found["items"]], q
    item = (await h.get("/api/fleet/a/hashmap", params={"q": hash_hex(first)})).json()["items"][0]
    assert item["hash_int"] == str(first) and item["block_size"] == 4
    by_copies = (await h.get("/api/fleet/a/hashmap", params={"sort": "copies"})).json()["items"]
    assert [i["copies"] for i in by_copies] == sorted(
        (i["copies"] for i in by_copies), reverse=True
    )
    multi = (await h.get("/api/fleet/a/hashmap", params={"multi_only": True})).json()
    assert multi["matched"] == sum(1 for v in want.values() if v > 1)
    deep = (await h.get("/api/fleet/a/hashmap", params={"sort": "depth", "limit": 1})).json()
    assert deep["items"][0]["depth"] >= 1
    assert (await h.get("/api/fleet/a/hashmap", params={"sort": "x"})).status_code == 422

    # the whole map at one moment, with the last event of the log it includes
    snap = (await h.get("/api/fleet/a/snapshot")).json()
    assert {i["hash"]: i["copies"] for i in snap["items"]} == {
        hash_hex(k): v for k, v in want.items()
    }
    assert (snap["total_keys"], snap["blocks"], snap["truncated"]) == (
        len(want), sum(want.values()), False,
    )  # fmt: skip
    assert snap["event_log_seq"] == a["event_log_seq"] == sum(len(b) for b in batches["a"])
    assert snap["state_resets"] == a["state_resets"] == 0
    stored = [i["stored_seq"] for i in snap["items"]]
    assert stored == sorted(stored)
    assert all(len(i["tokens"]) <= 16 for i in snap["items"])
    two = (await h.get("/api/fleet/a/snapshot", params={"limit": 2})).json()
    assert (len(two["items"]), two["truncated"]) == (2, True)
    assert (await h.get("/api/fleet/nope/snapshot")).status_code == 404

    tree = (await h.get("/api/fleet/a/prefix-tree")).json()
    assert tree["total"] == len(want) == len(tree["nodes"])
    by_hash = {n["hash"]: n for n in tree["nodes"]}
    for n in tree["nodes"]:
        if n["depth"] > 1:
            assert by_hash[n["parent"]]["depth"] == n["depth"] - 1
    assert sum(1 for n in tree["nodes"] if n["depth"] == 1) == tree["roots"]

    evs = (await h.get("/api/fleet/a/events", params={"since": 0, "limit": 10_000})).json()
    assert len(evs["items"]) == sum(len(b) for b in batches["a"]) == evs["last_seq"]
    assert [e["seq"] for e in evs["items"]] == list(range(1, evs["last_seq"] + 1))
    assert evs["items"][-1]["batch_seq"] == 59
    tail = (await h.get("/api/fleet/a/events", params={"since": evs["last_seq"]})).json()
    assert tail["items"] == [] and tail["next"] == evs["last_seq"]

    # which instances hold which prefixes
    over = (await h.get("/api/fleet/prefixes")).json()
    assert over["instances"] == ["a", "b"] and over["items"]
    deepest = max(tree["nodes"], key=lambda n: n["depth"])
    one = (await h.get("/api/fleet/prefixes", params={"hash": deepest["hash"]})).json()
    assert one["query"]["blocks"] == deepest["depth"] and one["query"]["chain_complete"]
    row_a = next(r for r in one["instances"] if r["instance"] == "a")
    assert row_a["leading_blocks"] == deepest["depth"] and "a" in one["best"]
    chain = one["query"]["hashes"]
    several = (await h.get("/api/fleet/prefixes", params={"hash": ",".join(chain)})).json()
    assert several["instances"] == one["instances"]
    posted = (await h.post("/api/fleet/prefixes", json={"hashes": chain})).json()
    assert posted["instances"] == one["instances"]
    node_tokens = [by_hash[x]["tokens"] for x in chain]
    tokens = [t for chunk in node_tokens for t in chunk]
    by_tokens = await h.get("/api/fleet/prefixes", params={"tokens": ",".join(map(str, tokens))})
    row = next(r for r in by_tokens.json()["instances"] if r["instance"] == "a")
    assert row["leading_blocks"] == len(chain) and row["hashes"] == chain
    posted_t = (await h.post("/api/fleet/prefixes", json={"tokens": tokens})).json()
    assert posted_t["instances"] == by_tokens.json()["instances"]
    for bad in ({"hash": "zz"}, {"hash": "1", "tokens": "1"}, {"tokens": "a,b"}, {"hash": ","}):
        r = await h.get("/api/fleet/prefixes", params=bad)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_input", bad
    assert (await h.post("/api/fleet/prefixes", json={})).status_code == 422


def test_a_token_guards_every_read_and_the_stream() -> None:
    stored = BlockStored(
        block_hashes=[9], parent_block_hash=None, token_ids=[1], block_size=1,
        lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip

    async def main() -> None:
        with fake_publisher() as fp:
            async with live_observer(endpoints=[fp.endpoint], token="s3cret") as app:
                async with client(app) as anon, client(app, "s3cret") as ok:
                    for path in ("/api/fleet", "/metrics", "/api/fleet/prefixes"):
                        r = await anon.get(path)
                        assert r.status_code == 401, path
                        assert r.json()["error"]["code"] == "unauthorized"
                    assert (await anon.get("/api/health")).status_code == 200
                    assert (await ok.get("/api/fleet")).status_code == 200
                    wrong = await anon.get("/api/fleet", headers={"Authorization": "Bearer no"})
                    assert wrong.status_code == 401
                base = f"ws://127.0.0.1:{app.state.port}/api/fleet/stream"
                refusals = (
                    websockets.exceptions.ConnectionClosed,
                    websockets.exceptions.InvalidStatus,
                )
                with pytest.raises(refusals) as refused:
                    await _first_message(base)
                if isinstance(refused.value, websockets.exceptions.InvalidStatus):
                    assert refused.value.response.status_code in (401, 403)
                else:
                    assert refused.value.rcvd is not None and refused.value.rcvd.code == 4401
                # the fleet page's way: the token in Sec-WebSocket-Protocol, not the URL;
                # the server echoes only "blockpool"
                b64 = base64.urlsafe_b64encode(b"s3cret").decode().rstrip("=")
                protos = ["blockpool", f"base64url.bearer.{b64}"]
                async with websockets.connect(base, subprotocols=protos) as ws:  # type: ignore[arg-type]
                    assert ws.subprotocol == "blockpool"
                    assert json.loads(await ws.recv())["type"] == "hello"
                bad = ["blockpool", "bearer.nope"]
                with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                    await _first_message(base, bad)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
                async with websockets.connect(base + "?token=s3cret") as ws:
                    assert json.loads(await ws.recv())["type"] == "hello"
                    s = app.state.fleet.sources[fp.endpoint.removeprefix("tcp://")]
                    await await_for(lambda: s.connected)
                    await asyncio.to_thread(fp.wait_subscribed)
                    fp.send(0, positional([stored]))
                    ticks = await ws_ticks(ws, until=lambda m: bool(m["events"]))
                    ev = ticks[-1]["events"][0]
                    assert ev["type"] == "BlockStored" and ev["block_hashes"] == [hash_hex(9)]

    asyncio.run(main())
