"""A mirror's export is complete: its header carries the engine's free
order and facts, ``blockpool replay`` replays it exactly (before, an
``uncached_first`` engine's export replayed under vLLM 0.16's order and
operations were refused), and ``blockpool trace`` reads the engine's
requests from it, plain or gzip-compressed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from app.cli import main
from blockpool.analysis.replay import replay_file
from tests.app.conftest import running
from tests.mirror.rig import Rig, until
from tests.mirror.test_mirror_whatif import NUM_BLOCKS, serial_traffic
from tests.mirror.workload import BLOCK

pytestmark = pytest.mark.anyio


async def test_a_mirrors_export_replays_and_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = Rig("uncached_first", num_blocks=NUM_BLOCKS)
    rig.start()
    try:
        engine = rig.engine
        engine.tell_requests = True
        hello = await rig.hello()
        app, client = rig.service(hello, analysis_mode="inline", shadow_mode="inline")
        mine = app.state.engine
        async with running(app) as api:
            await until(lambda: rig.caught_up(client))
            base = engine.stats()
            hits = serial_traffic(engine, 60)  # requests alone: the planner's model
            served = engine.stats()
            engine.drive(30)  # then everything: raw blocks, evictions, decode, resets
            await until(lambda: rig.caught_up(client))
            # recorded from the first operation on: the export covers the 60 requests
            assert mine.analysis.recorder.first_seq <= 1
            r = await api.get("/api/history/export")
            assert r.status_code == 200
            plain = tmp_path / "mirror.jsonl"
            plain.write_text(r.text)
            r = await api.get("/api/history/export.jsonl.gz")
            assert r.status_code == 200
            packed = tmp_path / "mirror.jsonl.gz"
            packed.write_bytes(r.content)
            r = await api.get("/api/mirror/trace", headers={"Accept-Encoding": "gzip"})
            assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
            traffic = tmp_path / "traffic.jsonl"
            traffic.write_text(r.text)  # (httpx decompressed it)
            # bounded: the newest N, those of the last S seconds; bad bounds refused
            r = await api.get("/api/mirror/trace", params={"limit": 5})
            five = [json.loads(x) for x in r.text.splitlines()]
            assert five[0]["requests"] == 5 and len(five) == 6
            every = [json.loads(x) for x in traffic.read_text().splitlines()[1:]]
            lengths = [(x["input_length"], x["output_length"], x["hit_tokens"]) for x in every]
            assert [(x["input_length"], x["output_length"], x["hit_tokens"]) for x in five[1:]] == (
                lengths[-5:]
            )
            r = await api.get("/api/mirror/trace", params={"window_s": 1e-9})
            assert json.loads(r.text.splitlines()[0])["requests"] == 0
            for bad in ({"limit": 0}, {"window_s": -1}, {"window_s": "x"}, {"limit": 10**9}):
                r = await api.get("/api/mirror/trace", params=bad)
                assert r.status_code == 422, bad
        lines = plain.read_text().splitlines()
        head = json.loads(lines[0])
        assert head["settings"]["free_order"] == "uncached_first"
        facts = head["engine"]
        assert facts["vllm_version"] == "0.32.0" and facts["num_gpu_blocks"] == NUM_BLOCKS
        assert (facts["block_size"], facts["hash_fn"], facts["free_order"]) == (
            BLOCK,
            "sha256",
            "uncached_first",
        )
        requests = [json.loads(x) for x in lines if '"type": "request"' in x]
        assert len(requests) >= 60
        assert all("token_ids" not in q for q in requests)

        # replayed exactly, in the engine's free order
        for path in (plain, packed):
            report = replay_file(path)
            assert report.ok, report.problems
            assert report.refused == 0 and report.ops > 100
            assert report.free_order == "uncached_first" and report.engine == "vLLM 0.32.0"
            assert report.final_matches is True
        capsys.readouterr()
        assert main(["replay", str(packed)]) == 0
        assert "free order uncached_first of vLLM 0.32.0" in capsys.readouterr().out

        # ... and without its free order (the export before): refused operations
        old = dict(head, settings={k: v for k, v in head["settings"].items() if k != "free_order"})
        stale = tmp_path / "stale.jsonl"
        stale.write_text("\n".join([json.dumps(old), *lines[1:]]) + "\n")
        stale_report = replay_file(stale)
        assert not stale_report.ok and stale_report.free_order == "append_all"
        assert stale_report.refused + stale_report.result_mismatches > 0

        # the planner reads the engine's requests from the export, plain or
        # gzip, as it reads them from GET /api/mirror/trace
        docs = []
        for path in (plain, packed, traffic):
            argv = ["trace", str(path), "--block-size", str(BLOCK)]
            argv += ["--free-order", "uncached_first", "--capacity-blocks", str(NUM_BLOCKS)]
            assert main([*argv, "--json", "--no-progress"]) == 0
            docs.append(json.loads(capsys.readouterr().out))
        assert docs[0]["results"] == docs[1]["results"] == docs[2]["results"]
        assert docs[0]["requests"] == len(requests) > 60
        # the 60 requests served alone, at the engine's size: the engine's hits
        cut = tmp_path / "first60.jsonl"
        header = {"type": "header", "format": "blockpool-mirror-trace", "tokens_per_id": BLOCK}
        rows = [{k: v for k, v in q.items() if k != "type"} for q in requests[:60]]
        cut.write_text("".join(json.dumps(x) + "\n" for x in [header, *rows]))
        argv = ["trace", str(cut), "--block-size", str(BLOCK), "--free-order", "uncached_first"]
        assert main([*argv, "--capacity-blocks", str(NUM_BLOCKS), "--json", "--no-progress"]) == 0
        res = json.loads(capsys.readouterr().out)["results"][0]
        assert res["hit_tokens"] == hits * BLOCK == served[2] - base[2]
        assert res["evictions"] > 0
        mine.check()
        engine.rt.check()
    finally:
        rig.close()


def test_a_gzip_trace_is_read_within_its_bound(tmp_path: Path) -> None:
    """``blockpool trace`` reads a ``.gz`` trace as it is; a gzip body is
    refused unless a bound is given, one past its bound or cut off is
    refused naming why."""
    from blockpool.trace import TraceError, parse_trace, read_trace

    rows = [
        {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 5, "input_length": 9, "output_length": 2, "hash_ids": [1, 2, 4]},
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    p = tmp_path / "t.jsonl.gz"
    p.write_bytes(gzip.compress(text))
    got = read_trace(p, tokens_per_id=4)
    assert [r.hash_ids for r in got.requests] == [(1, 2, 3), (1, 2, 4)]
    with pytest.raises(TraceError, match="gzip-compressed: decompress it first"):
        parse_trace(gzip.compress(text), 4)
    with pytest.raises(TraceError, match=f"more than {len(text) - 1} bytes decompressed"):
        parse_trace(gzip.compress(text), 4, gzip_max_bytes=len(text) - 1)
    assert len(parse_trace(gzip.compress(text), 4, gzip_max_bytes=len(text))) == 2
    with pytest.raises(TraceError, match="cut off"):
        parse_trace(gzip.compress(text)[:-12], 4, gzip_max_bytes=1 << 20)
