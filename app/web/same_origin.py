"""Refuse what a web page the operator visits could make their browser send.

One ASGI middleware, for every HTTP request and websocket handshake, token
or no token (defence in depth):

- **Cross-site requests** (``cross_site_refused``, 403): a request that can
  change something — every method but GET/HEAD/OPTIONS, and every websocket
  handshake — whose ``Origin`` (or, without one, ``Referer``) is not this
  server's own origin (the ``Host`` it was sent to) nor one of
  ``allowed_origins``.  ``Origin: null`` (sandboxed frames, ``file:``) is
  refused too; so is ``Sec-Fetch-Site: cross-site`` when neither header came.
  A request with no ``Origin``, no ``Referer`` and no ``Sec-Fetch-*`` header is
  not from a browser page (curl, scripts, the Python client): it is allowed —
  a browser always names the origin of a cross-site POST.
- **DNS rebinding** (``host_refused``, 403): every request — reads too, from
  a browser or not — whose ``Host`` is a name other than a loopback name
  (``localhost``, ``*.localhost``), the bound ``--host`` or one of
  ``allowed_hosts`` ("*" allows any).  A rebound page may strip ``Origin``,
  ``Referer`` and (on plain http) never sends ``Sec-Fetch-*``, so nothing but
  the ``Host`` tells its requests apart: the check cannot depend on them.
  IP-address hosts are always accepted: rebinding needs a DNS name the
  attacker controls (a page served from an IP address is that address's own
  origin), and a server bound to 0.0.0.0 is reached by its LAN address.  A
  request without a ``Host`` header (HTTP/1.0) is not from a browser and is
  served.  Scripts and proxies that call the server by another name add it
  with ``--allowed-host NAME`` (``BLOCKPOOL_ALLOWED_HOSTS``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.shared.errors import send_error

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "*"})
_DEFAULT_PORT = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(host: str) -> str:
    """``Host`` header -> the name without port (IPv6 without brackets)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") > 1:  # a bare IPv6 address
        return host
    return host.rsplit(":", 1)[0] if ":" in host else host


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of a URL (default port dropped), or None."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname:
        return None
    scheme = parts.scheme.lower()
    hostname = parts.hostname.lower()
    shown = f"[{hostname}]" if ":" in hostname else hostname
    if port is not None and str(port) != _DEFAULT_PORT.get(scheme):
        shown = f"{shown}:{port}"
    return f"{scheme}://{shown}"


def _netloc(origin: str) -> str:
    return origin.split("://", 1)[1]


def _host_netloc(host: str, scheme: str) -> str:
    """The ``Host`` header as an origin's netloc (default port dropped)."""
    host = host.strip().lower()
    default = _DEFAULT_PORT.get(scheme)
    if default and host.endswith(f":{default}") and not host.endswith("]"):
        host = host[: -len(default) - 1]
    return host


class SameOriginGuard:
    """See the module docstring; ``allowed_hosts`` / ``allowed_origins`` come
    from the settings (``--allowed-host``, ``--allowed-origin``)."""

    def __init__(
        self,
        app: ASGIApp,
        bind_host: str,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
    ) -> None:
        self.app = app
        hosts = {h.strip().lower() for h in allowed_hosts if h.strip()}
        self.any_host = "*" in hosts
        bind = bind_host.strip().lower().strip("[]")
        if bind not in WILDCARD_BINDS:
            hosts.add(bind)
        self.hosts = frozenset(hosts | LOOPBACK_NAMES)
        self.origins = frozenset(o for o in (origin_of(x) for x in allowed_origins) if o)

    def host_ok(self, host: str) -> bool:
        name = host_name(host)
        if not name:  # no Host header: HTTP/1.0, never a browser
            return True
        return self.any_host or name in self.hosts or name.endswith(".localhost") or _is_ip(name)

    def refusal(self, kind: str, method: str, headers: Headers) -> tuple[str, str, dict[str, str]]:
        """(code, message, details) when the request is refused, else ("", "", {})."""
        host = headers.get("host", "")
        origin_header = headers.get("origin")
        referer = headers.get("referer")
        fetch_site = headers.get("sec-fetch-site")
        if not self.host_ok(host):
            return (
                "host_refused",
                f"this server does not answer under the host name {host[:200]!r} (a page "
                "on another site may be rebinding its DNS name to this address); start "
                "the server with --allowed-host NAME to accept it",
                {"host": host[:200]},
            )
        if kind == "http" and method in SAFE_METHODS:
            return "", "", {}
        own = {_host_netloc(host, "http"), _host_netloc(host, "https")}
        if origin_header is not None:
            given = origin_header.strip()
            origin = origin_of(given) if given.lower() != "null" else None
        elif referer is not None:
            given = referer
            origin = origin_of(referer)
        else:
            if fetch_site in ("cross-site", "same-site"):
                return (
                    "cross_site_refused",
                    f"a {fetch_site} request from a web page may not change this server",
                    {"sec_fetch_site": fetch_site},
                )
            return "", "", {}
        if origin is not None and (origin in self.origins or _netloc(origin) in own):
            return "", "", {}
        return (
            "cross_site_refused",
            f"a request from the page {given[:200]!r} may not change this server (its "
            f"origin is not this server's own, {host!r}); start the server with "
            "--allowed-origin ORIGIN to accept that page",
            {"origin": given[:200], "host": host},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        code, message, details = self.refusal(
            kind, scope.get("method", "GET").upper(), Headers(scope=scope)
        )
        if not code:
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            # before accepting: the server answers the handshake with 403
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": code})
            return
        await send_error(send, 403, code, message, details)
