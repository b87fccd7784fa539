"""Every file a page loads, found as a browser would: ``<script src>``,
``<link href>``, ES module imports (static and dynamic) and CSS ``@import`` /
``url()`` — followed recursively, each fetched once.

``crawl(get, base, pages)`` takes ``get(url) -> (status, content_type, text)``
so the same walk runs against an ASGI client or a real server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import httpx

Get = Callable[[str], tuple[int, str, str]]


def client_get(client: httpx.Client) -> Get:
    """``get`` for ``crawl`` through an httpx client."""

    def get(url: str) -> tuple[int, str, str]:
        r = client.get(url)
        return r.status_code, r.headers.get("content-type", ""), r.text

    return get


_SCRIPT = re.compile(r"<script\b([^>]*)>", re.I)
_LINK = re.compile(r"<link\b([^>]*)>", re.I)
_ATTR = re.compile(r"""\b(src|href|type|rel)\s*=\s*["']([^"']*)["']""", re.I)
_MODULE_IMPORTS = (
    re.compile(r"""\b(?:import|export)\b[^;'"]*?\bfrom\s*["']([^"']+)["']"""),
    re.compile(r"""\bimport\s*["']([^"']+)["']"""),
    re.compile(r"""\bimport\(\s*["']([^"']+)["']\s*\)"""),
)
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)  # JSDoc types name files the browser never loads
_CSS_REFS = (
    re.compile(r"""@import\s+["']([^"']+)["']"""),
    re.compile(r"""url\(\s*["']?([^"')]+?)["']?\s*\)"""),
)
EXPECTED_TYPE = {
    "module": "javascript",
    "script": "javascript",
    "style": "text/css",
    "html": "text/html",
    "png": "image/png",
}


@dataclass
class Crawl:
    fetched: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # url: kind, status, ct
    foreign: list[tuple[str, str]] = field(default_factory=list)  # (from page, url)

    def problems(self) -> list[str]:
        out = [f"{page} loads {url} from another origin" for page, url in self.foreign]
        for url, (kind, status, ctype) in sorted(self.fetched.items()):
            if status != 200:
                out.append(f"{url} ({kind}): HTTP {status}")
            elif EXPECTED_TYPE.get(kind, "") not in ctype:
                out.append(f"{url} ({kind}): content-type {ctype!r}")
        return out


def _attrs(tag: str) -> dict[str, str]:
    return {k.lower(): v for k, v in _ATTR.findall(tag)}


def _refs(kind: str, text: str) -> Iterable[tuple[str, str]]:
    """(kind, reference) pairs a file of ``kind`` makes the browser load."""
    if kind == "html":
        for tag in _SCRIPT.findall(text):
            a = _attrs(tag)
            if "src" in a:
                yield ("module" if a.get("type") == "module" else "script"), a["src"]
        for tag in _LINK.findall(text):
            a = _attrs(tag)
            rel = a.get("rel", "").lower()
            if "href" not in a:
                continue
            if "stylesheet" in rel:
                yield "style", a["href"]
            elif "modulepreload" in rel:
                yield "module", a["href"]
            elif "icon" in rel:
                yield ("png" if a["href"].endswith(".png") else "icon"), a["href"]
    elif kind == "module":
        code = _BLOCK_COMMENT.sub("", text)
        for pattern in _MODULE_IMPORTS:
            for ref in pattern.findall(code):
                yield "module", ref
    elif kind == "style":
        for pattern in _CSS_REFS:
            for ref in pattern.findall(text):
                yield ("style" if ref.endswith(".css") else "asset"), ref
    # a classic script (a vendored bundle) is not parsed: it loads what it
    # loads at run time, which only a browser test can see


def crawl(get: Get, base: str, pages: Iterable[str]) -> Crawl:
    origin = urlsplit(base)[:2]
    result = Crawl()
    todo: list[tuple[str, str]] = [("html", urljoin(base, p)) for p in pages]
    while todo:
        kind, url = todo.pop()
        if url in result.fetched:
            continue
        status, ctype, text = get(url)
        result.fetched[url] = (kind, status, ctype)
        if status != 200 or kind in ("script", "png", "icon", "asset"):
            continue
        for sub_kind, ref in _refs(kind, text):
            if ref.startswith("data:"):
                continue
            target = urljoin(url, ref).split("#")[0]
            if urlsplit(target)[:2] != origin:
                result.foreign.append((url, target))
                continue
            todo.append((sub_kind, target))
    return result
