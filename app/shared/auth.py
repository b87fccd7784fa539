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

Also here: ``RedactSecrets``, the logging filter that blanks every secret a
request can carry (``redact``) in every record, at every level — uvicorn's
and websockets' debug lines show handshake headers and URLs — installed by
``install_log_redaction``.
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
from urllib.parse import unquote_plus

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

REDACTED = "[redacted]"
LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "websockets", "blockpool")
SECRET_PARAMS = frozenset({"token", "ticket"})

# a URL's query parameter (its name as sent, maybe percent-encoded)
_QUERY_PARAM = re.compile(r"([?&])([^=&\s\"'#?]+)=([^&\s\"'#]*)")
# an Authorization header as a log line shows it (uvicorn's debug lines: "< authorization: x")
_AUTH_HEADER = re.compile(
    r"((?:proxy-)?authorization\s*[:=]\s*+)(?!\[redacted\])[^\r\n\"',]+", re.IGNORECASE
)
# "Bearer <token>" anywhere; the subprotocols bearer.* / base64url.bearer.* / ticket.*
_BEARER_WORD = re.compile(r"(\bbearer\s++)(?!\[redacted\])[^\s\"',;]+", re.IGNORECASE)
_SUBPROTOCOL = re.compile(
    r"(\b(?:base64url\.bearer|bearer|ticket)\.)(?!\[redacted\])[^\s\"',;\]]+", re.IGNORECASE
)


def _param(match: re.Match[str]) -> str:
    sep, name, value = match.groups()
    # the server decodes the name (?tok%65n= is ?token=), so the filter does too
    if unquote_plus(name).strip().lower() in SECRET_PARAMS and value:
        return f"{sep}{name}={REDACTED}"
    return match.group(0)


def _spelled(char: str) -> str:
    """A pattern for ``char`` as is or percent-encoded (any hex case)."""
    encoded = "".join(f"%{b:02x}" for b in _utf8(char))
    alternatives = [re.escape(char), encoded] + (["\\+"] if char == " " else [])
    return f"(?:{'|'.join(alternatives)})"


def secret_pattern(token: str) -> re.Pattern[str] | None:
    """Every spelling of ``token`` a log line could show: as is or with any of
    its characters percent-encoded, and base64url (the dashboard's
    subprotocol); None for a token under 4 characters (it would blank
    ordinary text)."""
    if len(token) < 4:
        return None
    b64 = base64.urlsafe_b64encode(_utf8(token)).decode("ascii")
    spellings = ["".join(_spelled(c) for c in token), re.escape(b64), re.escape(b64.rstrip("="))]
    return re.compile("|".join(spellings), re.IGNORECASE)


_known_secrets: list[re.Pattern[str]] = []


def redact(text: str) -> str:
    """``text`` with every secret a request can carry blanked: the value of a
    URL's ``token`` / ``ticket`` parameter (however its name is spelled:
    case, percent-encoding), an ``Authorization`` header, ``Bearer <token>``,
    the ``bearer.`` / ``base64url.bearer.`` / ``ticket.`` subprotocols, and
    every spelling of a server's token (``install_log_redaction``)."""
    if "=" in text:
        text = _QUERY_PARAM.sub(_param, text)
    text = _AUTH_HEADER.sub(rf"\1{REDACTED}", text)
    text = _BEARER_WORD.sub(rf"\1{REDACTED}", text)
    text = _SUBPROTOCOL.sub(rf"\1{REDACTED}", text)
    for secret in _known_secrets:
        text = secret.sub(REDACTED, text)
    return text


def _redact_arg(arg: object) -> object:
    return redact(arg) if isinstance(arg, str) else arg


class RedactSecrets(logging.Filter):
    """Rewrites a record whose message shows a secret (see ``redact``): its
    text arguments one by one when that is enough (formatters that read the
    arguments, like uvicorn's access log, keep working), else the whole
    message; a traceback's text too."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: leave it to logging
            return True
        if redact(message) != message:
            args = record.args
            if isinstance(args, tuple):
                record.args = tuple(_redact_arg(a) for a in args)
            elif isinstance(args, Mapping):
                record.args = {k: _redact_arg(v) for k, v in args.items()}
            if isinstance(record.msg, str):
                record.msg = redact(record.msg)
            try:
                again = record.getMessage()
            except (TypeError, ValueError):
                again = message
            if redact(again) != again:
                record.msg, record.args = redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction(token: str | None = None) -> None:
    """Add ``RedactSecrets`` (once each) to the loggers of uvicorn, websockets
    and blockpool and to every handler of those and of the root logger, so
    that a record from any logger is redacted at every level (a logger's
    filter does not see its children's records; a handler's sees them all).
    ``token``: the server's token, blanked in every spelling.  Call it again
    after logging is configured (``logging.config.dictConfig`` keeps a
    logger's filters but makes new handlers)."""
    pattern = secret_pattern(token) if token else None
    if pattern is not None and all(p.pattern != pattern.pattern for p in _known_secrets):
        _known_secrets.append(pattern)
    targets: list[logging.Filterer] = []
    for name in (None, *LOGGERS):
        log = logging.getLogger(name)
        if name is not None:
            targets.append(log)
        targets.extend(log.handlers)
    for target in targets:
        if not any(isinstance(f, RedactSecrets) for f in target.filters):
            target.addFilter(RedactSecrets())
