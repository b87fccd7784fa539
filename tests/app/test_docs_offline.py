"""``/docs`` works offline and documents what every route returns.

- the docs page references only this server's assets, and they are served
  (200, the right content type); ReDoc (CDN-only) is off;
- in headless Chromium the page makes no request to another origin and lists
  every operation;
- every operation in /openapi.json has a success response with a schema that
  names its fields;
- a real response of every operation validates against its declared schema,
  and every top-level key it holds is declared (the docs are complete).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema_rs
import pytest

from tests.app.conftest import LiveServer, free_port, make_app
from tests.app.page_assets import client_get, crawl
from tests.chromium import CHROMIUM, CHROMIUM_ARGS, require_chromium


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    """A real server (inline analysis: answers are there when asked)."""
    app = make_app(analysis_mode="inline", shadow_mode="inline")
    with (
        LiveServer(app, free_port()).running() as server,
        httpx.Client(base_url=server.url, timeout=30) as c,
    ):
        yield c


def test_docs_reference_only_this_servers_assets_and_they_are_served(
    client: httpx.Client,
) -> None:
    html = client.get("/docs")
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert "://" not in html.text  # no absolute URL: no CDN, no online validator
    assert "validatorUrl" in html.text and '"validatorUrl": null' in html.text
    result = crawl(client_get(client), str(client.base_url), ["/docs"])
    assert result.problems() == []
    kinds = sorted(kind for kind, _, _ in result.fetched.values())
    assert kinds == ["html", "png", "script", "style"]
    bundle = client.get("/docs-assets/swagger-ui-bundle.js")
    assert b"SwaggerUIBundle" in bundle.content and len(bundle.content) > 1_000_000
    assert client.get("/docs-assets/LICENSE").status_code == 200
    assert client.get("/redoc").status_code == 404


def test_every_operation_declares_a_success_schema_with_fields(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    components = spec["components"]["schemas"]
    operations = 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            operations += 1
            where = f"{method.upper()} {path}"
            ok = [c for c in op["responses"] if c in ("200", "201")]
            assert len(ok) == 1, where
            content = op["responses"][ok[0]]["content"]
            if "application/x-ndjson" in content:  # the recording's export
                assert content["application/x-ndjson"]["schema"] == {"type": "string"}, where
                continue
            if "application/gzip" in content:  # the export as a .jsonl.gz file
                assert content["application/gzip"]["schema"] == {"type": "string"}, where
                continue
            schema = content["application/json"]["schema"]
            assert set(schema) == {"$ref"}, (where, schema)
            model = components[schema["$ref"].rsplit("/", 1)[1]]
            assert model.get("properties"), (where, model)
            assert model.get("description"), (where, "the model says what it is")
    assert operations >= 39


def _exercise(client: httpx.Client) -> dict[tuple[str, str], Any]:
    """A real, successful response of every operation, keyed like the spec."""
    seen: dict[tuple[str, str], Any] = {}

    def call(method: str, template: str, url: str | None = None, **kw: Any) -> Any:
        r = client.request(method, url or template, **kw)
        assert r.status_code in (200, 201), f"{method} {url or template}: {r.text}"
        body = r.json() if r.headers["content-type"].startswith("application/json") else r.text
        seen[(method.lower(), template)] = body
        return body

    ids = call("POST", "/api/pool/allocate", json={"num_blocks": 3})["block_ids"]
    hashes = call("POST", "/api/pool/cache", json={"block_ids": ids[:2],
                                                   "token_ids": list(range(8))})  # fmt: skip
    call("POST", "/api/pool/free", json={"block_ids": ids})
    call("POST", "/api/pool/touch", json={"block_ids": [ids[0]]})
    client.post("/api/pool/free", json={"block_ids": [ids[0]]})
    call("GET", "/api/pool/lookup", params={"block_hash": hashes["block_hashes"][0]})
    call("POST", "/api/pool/prefix-lookup", json={"token_ids": list(range(10))})
    call("POST", "/api/pool/evict", json={"block_ids": [ids[1]]})
    a = call("POST", "/api/requests", json={"token_ids": list(range(13))})
    b = client.post("/api/requests", json={"token_ids": [*range(9), 77, 78]}).json()
    rid = a["request_id"]
    call("POST", "/api/requests/{request_id}/tokens", f"/api/requests/{rid}/tokens",
         json={"token_ids": [1, 2, 3, 4, 5]})  # fmt: skip
    call("POST", "/api/requests/{request_id}/verify", f"/api/requests/{rid}/verify")
    call("GET", "/api/requests")
    call("GET", "/api/requests/{request_id}", f"/api/requests/{rid}")
    call("GET", "/api/blocks/{block_id}", f"/api/blocks/{ids[0]}")
    for path in ("queue", "hashmap", "prefix-tree", "events", "samples", "series", "storage",
                 "health", "config", "summary", "demo", "misses", "regret", "shadows",
                 "kv-events"):  # fmt: skip
        call("GET", f"/api/{path}")
    call("GET", "/api/misses/requests/{request_id}", f"/api/misses/requests/{b['request_id']}")
    call("GET", "/api/requests/{request_id}/story", f"/api/requests/{rid}/story")
    call("GET", "/api/pool/rates")
    call("POST", "/api/stream/ticket")
    call("GET", "/api/analysis/recent")
    # partial application (on_error stop): a result row and an error row
    call("POST", "/api/batch", json={"ops": [{"op": "allocate", "num_blocks": 1},
                                             {"op": "touch", "block_ids": [0]}],
                                     "on_error": "stop"})  # fmt: skip
    row = '{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [7]}\n'
    call("GET", "/api/trace")
    call("POST", "/api/trace/upload", content=row.encode(), params={"tokens_per_id": 64})
    call("POST", "/api/trace/start")
    call("POST", "/api/trace/stop")
    call("POST", "/api/demo/config", json={"rate": 3})
    call("POST", "/api/demo/start")
    call("POST", "/api/demo/stop")
    call("POST", "/api/requests/{request_id}/finish", f"/api/requests/{rid}/finish")
    client.post(f"/api/requests/{b['request_id']}/finish")
    held = [i for i, r in enumerate(client.get("/api/queue").json()["items"]) if r is None]
    assert held == []
    for row in seen[("post", "/api/batch")]["results"]:
        if row["ok"] and "block_ids" in row["result"]:
            client.post("/api/pool/free", json={"block_ids": row["result"]["block_ids"]})
    hist = call("GET", "/api/history")
    first, last = str(hist["first_seq"]), str(hist["last_seq"])
    call("GET", "/api/history/state", params={"at": last, "include_blocks": True})
    call("GET", "/api/history/diff", params={"from": first, "to": last})
    call("GET", "/api/history/export/size")
    call("GET", "/api/history/export")
    call("GET", "/api/history/export.jsonl.gz")
    call("GET", "/api/history/export/size")
    call("POST", "/api/pool/reset")
    return seen


def test_real_responses_match_their_declared_models(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    seen = _exercise(client)
    declared = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert set(seen) == declared, declared ^ set(seen)
    components = spec["components"]["schemas"]
    problems = []
    for (method, path), body in seen.items():
        op = spec["paths"][path][method]
        code = "201" if "201" in op["responses"] else "200"
        content = op["responses"][code]["content"]
        if "application/x-ndjson" in content:
            assert isinstance(body, str) and body.count("\n") >= 2
            continue
        if "application/gzip" in content:  # the .jsonl.gz file
            assert isinstance(body, str) and body
            continue
        ref = content["application/json"]["schema"]["$ref"]
        validator = jsonschema_rs.Draft202012Validator(
            {"$ref": ref, "components": spec["components"]}
        )
        problems += [f"{method.upper()} {path}: {e}" for e in validator.iter_errors(body)]
        props = components[ref.rsplit("/", 1)[1]]["properties"]
        undeclared = set(body) - {p.get("alias", name) for name, p in props.items()} - set(props)
        if undeclared:
            problems.append(f"{method.upper()} {path}: keys not in its model: {sorted(undeclared)}")
    assert problems == [], "\n".join(problems)


# every operation the page shows, as "METHOD /path"
SHOWN_OPERATIONS = """() => [...document.querySelectorAll('.opblock')].map(op =>
  op.querySelector('.opblock-summary-method').textContent + ' ' +
  op.querySelector('.opblock-summary-path').getAttribute('data-path'))"""


@pytest.mark.browser
def test_docs_in_a_browser_load_nothing_from_outside_and_list_the_operations() -> None:
    require_chromium()
    from playwright.sync_api import sync_playwright

    app = make_app()
    server = LiveServer(app, free_port())
    server.start()
    origin = urlsplit(server.url)[:2]
    requests: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.on("request", lambda req: requests.append(req.url))
                page.goto(f"{server.url}/docs")
                page.wait_for_selector(".opblock", timeout=30_000)
                shown = page.evaluate(SHOWN_OPERATIONS)
                page.wait_for_load_state("networkidle")
            finally:
                browser.close()
        spec = app.openapi()
        operations = {f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m in ops}
        assert set(shown) == operations  # (an operation with two tags is shown twice)
        foreign = [u for u in requests if urlsplit(u)[:2] != origin]
        assert foreign == []
        assert f"{server.url}/openapi.json" in requests
        server.call(server.engine.check)
    finally:
        server.stop()
