"""The one token check of the service, the observer and their websockets.

``token_matches`` is the only place a presented secret is compared with the
server's token: both sides are UTF-8 encoded and compared as bytes with
``hmac.compare_digest`` (on ``str`` it raises for non-ASCII text, which was a
500), so any text a header, a query string or a subprotocol can carry gives a
plain yes or no.

Where a websocket may carry its credentials (``websocket_credentials``):

- ``Authorization: Bearer <token>`` (non-browser clients);
- the ``Sec-WebSocket-Protocol`` header: ``bearer.<token>`` (a token made of
  header-token characters) or ``base64url.bearer.<base64url(token)>`` (any
  token; what the dashboard sends), next to ``blockpool``, the only
  subprotocol the server ever echoes (``accept_subprotocol``);
- ``ticket.<ticket>`` in ``Sec-WebSocket-Protocol``, or ``?ticket=``: a
  single-use ticket from ``POST /api/stream/ticket`` (``TicketBook``);
- ``?token=`` — old clients only, discouraged: a URL ends up in logs and
  browser history (the server's own log lines are redacted, ``RedactSecrets``).

Also here: ``RedactSecrets``, the logging filter that blanks ``token=`` and
``ticket=`` in every line uvicorn logs (``install_log_redaction``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SUBPROTOCOL = "blockpool"
BEARER_PREFIX = "bearer."
BEARER_B64_PREFIX = "base64url.bearer."
TICKET_PREFIX = "ticket."


def _utf8(text: str) -> bytes:
    # surrogatepass: even a lone surrogate (which no header can carry, but a
    # caller might pass) encodes instead of raising
    return text.encode("utf-8", "surrogatepass")


def token_matches(given: str | bytes | None, token: str) -> bool:
    """True when ``given`` is the token (surrounding whitespace ignored)."""
    if given is None:
        return False
    raw = given if isinstance(given, bytes) else _utf8(given)
    return hmac.compare_digest(raw.strip(), _utf8(token))


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    return given if scheme.lower() == "bearer" else None


def headers_token_ok(headers: Mapping[str, str], token: str) -> bool:
    """REST: the request carries ``Authorization: Bearer <token>``."""
    return token_matches(bearer_token(headers), token)


@dataclass(frozen=True)
class WebSocketCredentials:
    """What a websocket handshake presented (each None when absent)."""

    header: str | None = None  # Authorization: Bearer
    subprotocol: str | bytes | None = None  # bearer.* / base64url.bearer.*
    ticket: str | None = None  # ticket.* subprotocol or ?ticket=
    query: str | None = None  # ?token= (discouraged)


def _b64url(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:  # bad padding or alphabet, non-ASCII text
        return None


def websocket_credentials(
    headers: Mapping[str, str], subprotocols: Iterable[str], query: Mapping[str, str]
) -> WebSocketCredentials:
    sub: str | bytes | None = None
    ticket: str | None = query.get("ticket")
    for proto in subprotocols:
        if proto.startswith(BEARER_B64_PREFIX):
            sub = _b64url(proto[len(BEARER_B64_PREFIX) :])
        elif proto.startswith(BEARER_PREFIX):
            sub = proto[len(BEARER_PREFIX) :]
        elif proto.startswith(TICKET_PREFIX):
            ticket = proto[len(TICKET_PREFIX) :]
    return WebSocketCredentials(bearer_token(headers), sub, ticket, query.get("token"))


def websocket_token_ok(creds: WebSocketCredentials, token: str, tickets: TicketBook | None) -> bool:
    """Any one of the ways a websocket may authenticate (see the module doc)."""
    if tickets is not None and creds.ticket is not None and tickets.redeem(creds.ticket):
        return True
    return any(
        token_matches(given, token) for given in (creds.header, creds.subprotocol, creds.query)
    )


def accept_subprotocol(subprotocols: Iterable[str]) -> str | None:
    """``blockpool`` when the client offered it, else none: the server never
    echoes a credential (a browser that offered subprotocols needs one back)."""
    return SUBPROTOCOL if SUBPROTOCOL in subprotocols else None


# ------------------------------------------------------------------ tickets


class TicketBook:
    """Short-lived, single-use stream tickets (``POST /api/stream/ticket``).

    Only a digest of each ticket is kept; at most ``capacity`` are
    outstanding (issuing one more forgets the oldest)."""

    def __init__(self, ttl_s: float = 30.0, capacity: int = 256) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._expiry: OrderedDict[bytes, float] = OrderedDict()
        self.issued = 0
        self.redeemed = 0

    @staticmethod
    def _key(ticket: str) -> bytes:
        return hashlib.sha256(_utf8(ticket)).digest()

    def issue(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        self._expire(now)
        ticket = secrets.token_urlsafe(24)
        self._expiry[self._key(ticket)] = now + self.ttl_s
        while len(self._expiry) > self.capacity:
            self._expiry.popitem(last=False)
        self.issued += 1
        return ticket

    def redeem(self, ticket: str, now: float | None = None) -> bool:
        """True once for a ticket issued less than ``ttl_s`` ago."""
        now = time.monotonic() if now is None else now
        expiry = self._expiry.pop(self._key(ticket), None)
        if expiry is None or expiry < now:
            return False
        self.redeemed += 1
        return True

    def _expire(self, now: float) -> None:
        while self._expiry:
            key, expiry = next(iter(self._expiry.items()))
            if expiry >= now:
                break
            del self._expiry[key]

    def __len__(self) -> int:
        return len(self._expiry)


# ------------------------------------------------------------ log redaction

_SECRET_IN_URL = re.compile(r"([?&](?:token|ticket)=)[^&\s\"']*", re.IGNORECASE)
REDACTED = "[redacted]"
LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def redact(text: str) -> str:
    """``text`` with the value of every ``token=`` / ``ticket=`` of a URL blanked."""
    return _SECRET_IN_URL.sub(rf"\1{REDACTED}", text)


class RedactSecrets(logging.Filter):
    """Rewrites a record whose message shows a URL's token or ticket."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: leave it to logging
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


def install_log_redaction() -> None:
    """Add ``RedactSecrets`` to uvicorn's loggers (once; a later
    ``logging.config.dictConfig`` keeps a logger's filters)."""
    for name in LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in log.filters):
            log.addFilter(RedactSecrets())
