"""Bearer-token auth: every mutating endpoint needs the token (401 + the error
shape + WWW-Authenticate otherwise, nothing changed); reads stay open unless
protect_reads; the default bind address is loopback."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest

from app.cli import parser
from app.cli.settings import settings_from
from app.observer.bearer import token_ok
from app.shared import auth
from app.shared.settings import Settings
from tests.app.conftest import Api, assert_error, make_app, running

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"
GOOD = {"authorization": f"Bearer {TOKEN}"}

# Every mutating endpoint, with a body that would succeed on the seeded state.
WRITES: dict[str, Any] = {
    "/api/pool/allocate": {"num_blocks": 1},
    "/api/pool/touch": {"block_ids": [1]},
    "/api/pool/cache": {"block_ids": [3], "token_ids": [1, 2, 3, 4]},
    "/api/pool/free": {"block_ids": [3]},
    "/api/pool/evict": {"block_ids": [1]},
    "/api/pool/reset": None,
    "/api/requests": {"token_ids": [1, 2, 3]},
    "/api/requests/r/tokens": {"token_ids": [1]},
    "/api/requests/r/finish": None,
    "/api/batch": {"ops": [{"op": "allocate", "num_blocks": 1}]},
    "/api/demo/start": None,
    "/api/demo/stop": None,
    "/api/demo/config": {"rate": 3},
    "/api/trace/upload": {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]},
    "/api/trace/start": None,
    "/api/trace/stop": None,
}
READS = [
    "/api/config",
    "/api/summary",
    "/api/blocks/1",
    "/api/queue",
    "/api/hashmap",
    "/api/events",
    "/api/samples",
    "/api/series",
    "/api/requests",
    "/api/requests/r",
    "/api/demo",
    "/api/trace",
    "/api/pool/lookup?block_hash=abcd",
    "/metrics",
]
BAD_HEADERS: list[dict[str, Any]] = [
    {},
    {"authorization": "Bearer wrong"},
    {"authorization": f"Bearer {TOKEN}x"},
    {"authorization": f"Basic {TOKEN}"},
    {"authorization": TOKEN},
    {"authorization": "Bearer"},
    {"authorization": b"Bearer caf\xe9"},  # non-ASCII: used to be a 500
]


# POSTs that only read (they change nothing, so they follow the read rule).
# (/api/stream/ticket hands out read access to the stream: the read rule too)
READ_POSTS = {
    "/api/pool/prefix-lookup",
    "/api/requests/{request_id}/verify",
    "/api/stream/ticket",
}


def operations(app: Any) -> list[tuple[str, str, str]]:
    """(method, template, url) of every operation in the OpenAPI schema."""
    out = []
    for template, ops in app.openapi()["paths"].items():
        url = template.replace("{block_id}", "1").replace("{request_id}", "r")
        out.extend((method.upper(), template, url) for method in ops)
    return out


async def test_every_route_follows_the_auth_rules() -> None:
    """Behaviour, over the whole schema: with a token, every POST but the
    read-only ones answers 401 without it and every GET does not; with
    protect_reads every operation but /api/health does."""
    for protect_reads in (False, True):
        app = make_app(token=TOKEN, protect_reads=protect_reads)
        async with running(app) as api:
            before = api.fingerprint()
            ops = operations(app)
            assert len(ops) >= 30
            writes = 0
            for method, template, url in ops:
                r = await api.client.request(method, url, json={} if method == "POST" else None)
                needs_token = template != "/api/health" and (
                    protect_reads or (method == "POST" and template not in READ_POSTS)
                )
                if needs_token:
                    assert_error(r, 401, "unauthorized")
                    assert r.headers["www-authenticate"] == "Bearer"
                else:
                    assert r.status_code != 401, (method, template, r.text)
                writes += method == "POST" and template not in READ_POSTS
            assert writes == len(WRITES)
            assert api.fingerprint() == before
            api.check()


async def seed(api: Api) -> dict[str, Any]:
    await api.ok("POST", "/api/pool/allocate", {"num_blocks": 4}, headers=GOOD)
    await api.ok(
        "POST", "/api/pool/cache", {"block_ids": [1], "token_ids": [9, 9, 9, 9]}, headers=GOOD
    )
    await api.ok(
        "POST", "/api/requests", {"token_ids": list(range(9)), "request_id": "r"}, 201, headers=GOOD
    )
    return api.fingerprint()


@pytest.mark.app_settings(token=TOKEN)
async def test_writes_without_the_token_are_401_and_change_nothing(api: Api) -> None:
    before = await seed(api)
    demo_before = await api.ok("GET", "/api/demo")
    for path, body in WRITES.items():
        for headers in BAD_HEADERS:
            kw: dict[str, Any] = {"headers": headers}
            if body is not None:
                kw["json"] = body
            r = await api.client.post(path, **kw)
            err = assert_error(r, 401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
            if headers:
                assert "wrong" in err["message"]
            else:
                assert "Authorization: Bearer" in err["message"]
            # a broken body does not get past the token check either
            r = await api.client.post(
                path, content=b"{oops", headers={**headers, "content-type": "application/json"}
            )
            assert_error(r, 401, "unauthorized")
            r = await api.client.post(
                path, content=b"x", headers={**headers, "content-type": "text/plain"}
            )
            assert_error(r, 401, "unauthorized")
            r = await api.client.post(path, json={"wrong": "fields"}, headers=headers)
            assert_error(r, 401, "unauthorized")
    assert api.fingerprint() == before
    assert await api.ok("GET", "/api/demo") == demo_before
    assert not api.app.state.demo.running_task
    api.check()


@pytest.mark.app_settings(token=TOKEN)
async def test_writes_with_the_token_work(api: Api) -> None:
    await seed(api)
    for path, body in WRITES.items():
        kw: dict[str, Any] = {"headers": GOOD}
        if body is not None:
            kw["json"] = body
        if path == "/api/pool/reset":
            r = await api.client.post(path, **kw)
            assert_error(r, 409, "reset_refused")  # authorised, refused by the state
            continue
        r = await api.client.post(path, **kw)
        assert r.status_code in (200, 201), (path, r.text)
    # the token scheme is case-insensitive, surrounding space is tolerated
    r = await api.client.post(
        "/api/pool/allocate", json={"num_blocks": 1}, headers={"authorization": f"bearer  {TOKEN} "}
    )
    assert r.status_code == 200, r.text
    api.check()


@pytest.mark.app_settings(token=TOKEN)
async def test_reads_stay_open_by_default(api: Api) -> None:
    await seed(api)
    for path in READS:
        r = await api.get(path)
        assert r.status_code == 200, (path, r.text)
    r = await api.post("/api/pool/prefix-lookup", {"token_ids": [1, 2, 3]})
    assert r.status_code == 200
    cfg = await api.ok("GET", "/api/config")
    assert cfg["auth_required_for_writes"] is True and cfg["auth_required_for_reads"] is False
    assert TOKEN not in (await api.get("/api/config")).text


@pytest.mark.app_settings(token=TOKEN, protect_reads=True)
async def test_protect_reads(api: Api) -> None:
    await seed(api)
    for path in READS:
        for headers in BAD_HEADERS:
            r = await api.get(path, headers=headers)
            assert_error(r, 401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
        r = await api.get(path, headers=GOOD)
        assert r.status_code == 200, (path, r.text)
    r = await api.post("/api/pool/prefix-lookup", {"token_ids": [1, 2, 3]})
    assert_error(r, 401)
    r = await api.get("/api/pool/lookup?block_hash=zz")  # bad query: still 401 first
    assert_error(r, 401)
    # liveness stays open for probes
    assert (await api.get("/api/health")).status_code == 200
    cfg = await api.ok("GET", "/api/config", headers=GOOD)
    assert cfg["auth_required_for_reads"] is True
    api.check()


async def test_protect_reads_without_a_token_is_open() -> None:
    app = make_app(protect_reads=True)
    async with running(app) as api:
        assert (await api.get("/metrics")).status_code == 200
        assert (await api.post("/api/pool/allocate", {"num_blocks": 1})).status_code == 200
        api.check()


def test_default_bind_host_is_loopback() -> None:
    assert Settings().host == "127.0.0.1"
    assert Settings().token is None and Settings().protect_reads is False
    args = parser().parse_args(["serve"])
    assert settings_from(args).host == "127.0.0.1"
    args = parser().parse_args(["serve", "--token", TOKEN])
    assert settings_from(args).token == TOKEN


# ------------------------------------------------- the one token check (app/shared/auth.py)


@pytest.mark.parametrize(
    "given",
    ["caf\u00e9", "\u00b2", "t\u00f6k\u00e9n", "\ud800", "s3cre\u00e9", "", " ", "s3cre", "S3CRET"],
)
def test_any_text_is_a_plain_no_never_an_exception(given: str) -> None:
    # hmac.compare_digest("café", "s3cret") raises TypeError: the check compares bytes
    assert auth.token_matches(given, TOKEN) is False
    assert auth.token_matches(given.encode("utf-8", "surrogatepass"), TOKEN) is False
    assert token_ok(given, TOKEN) is False  # the observer's check is the same one
    assert auth.headers_token_ok({"authorization": f"Bearer {given}"}, TOKEN) is False


def test_the_right_token_matches_in_every_form() -> None:
    assert auth.token_matches(TOKEN, TOKEN) and auth.token_matches(f" {TOKEN}\t", TOKEN)
    assert auth.token_matches(TOKEN.encode(), TOKEN)
    assert auth.token_matches("caf\u00e9", "caf\u00e9")  # a non-ASCII token works too
    assert token_ok(TOKEN, TOKEN) and not token_ok(None, TOKEN)
    assert auth.headers_token_ok({"authorization": f"BEARER {TOKEN}"}, TOKEN)
    assert not auth.headers_token_ok({"authorization": f"Basic {TOKEN}"}, TOKEN)
    assert not auth.headers_token_ok({}, TOKEN)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_websocket_credentials_each_way_and_only_blockpool_is_echoed() -> None:
    book = auth.TicketBook()

    def ok(headers: dict[str, str], protocols: list[str], query: dict[str, str]) -> bool:
        creds = auth.websocket_credentials(headers, protocols, query)
        return auth.websocket_token_ok(creds, TOKEN, book)

    assert ok({"authorization": f"Bearer {TOKEN}"}, [], {})
    assert ok({}, ["blockpool", f"bearer.{TOKEN}"], {})
    assert ok({}, ["blockpool", f"base64url.bearer.{_b64(TOKEN)}"], {})
    assert ok({}, [], {"token": TOKEN})  # old clients (discouraged, redacted in logs)
    assert not ok({}, ["blockpool"], {})
    assert not ok({}, ["bearer.wrong"], {"token": "caf\u00e9"})
    assert not ok({}, ["base64url.bearer.%%%not-base64", "base64url.bearer.\u00e9"], {})
    assert not ok({}, [f"base64url.bearer.{_b64('wrong')}"], {})
    ticket = book.issue()
    assert ok({}, ["blockpool", f"ticket.{ticket}"], {})
    assert not ok({}, ["blockpool", f"ticket.{ticket}"], {})  # single use
    ticket = book.issue()
    assert ok({}, [], {"ticket": ticket}) and not ok({}, [], {"ticket": ticket})
    assert auth.accept_subprotocol(["blockpool", f"bearer.{TOKEN}"]) == "blockpool"
    assert auth.accept_subprotocol([f"bearer.{TOKEN}"]) is None
    assert auth.accept_subprotocol([]) is None


def test_tickets_expire_are_single_use_and_bounded() -> None:
    book = auth.TicketBook(ttl_s=30, capacity=3)
    t0 = book.issue(now=100.0)
    assert not book.redeem(t0 + "x", now=101.0)
    assert book.redeem(t0, now=129.0) and not book.redeem(t0, now=129.0)
    late = book.issue(now=200.0)
    assert not book.redeem(late, now=230.5)  # expired
    many = [book.issue(now=300.0) for _ in range(5)]
    assert len(book) == 3  # the two oldest were forgotten
    assert not book.redeem(many[0], now=300.0) and not book.redeem(many[1], now=300.0)
    assert all(book.redeem(t, now=301.0) for t in many[2:])
    assert book.issued == 7 and book.redeemed == 4


def test_log_lines_lose_their_token_and_ticket() -> None:
    line = '127.0.0.1:5 - "WebSocket /api/stream?channels=series&token=s3cret&epoch=1" [accepted]'
    assert auth.redact(line) == (
        '127.0.0.1:5 - "WebSocket /api/stream?channels=series&token=[redacted]&epoch=1" [accepted]'
    )
    assert auth.redact("GET /x?ticket=abc-_Z HTTP/1.1") == "GET /x?ticket=[redacted] HTTP/1.1"
    assert auth.redact("GET /x?tokens=1") == "GET /x?tokens=1"
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1:5", "/api/stream?token=s3cret"), None,
    )  # fmt: skip
    assert auth.RedactSecrets().filter(record)
    shown = record.getMessage()
    assert shown == '127.0.0.1:5 - "WebSocket /api/stream?token=[redacted]" [accepted]'
    auth.install_log_redaction()
    auth.install_log_redaction()
    for name in auth.LOGGERS:
        filters = logging.getLogger(name).filters
        assert sum(isinstance(f, auth.RedactSecrets) for f in filters) == 1


@pytest.mark.app_settings(token=TOKEN, protect_reads=True)
async def test_stream_tickets_need_the_read_token(api: Api) -> None:
    for headers in BAD_HEADERS:
        assert_error(await api.client.post("/api/stream/ticket", headers=headers), 401)
    body = await api.ok("POST", "/api/stream/ticket", headers=GOOD)
    assert set(body) == {"ticket", "expires_in"} and body["expires_in"] > 0
    assert len(body["ticket"]) >= 32 and TOKEN not in body["ticket"]
    assert api.app.state.stream.tickets.redeem(body["ticket"])
    api.check()
