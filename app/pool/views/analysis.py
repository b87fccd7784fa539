"""What the analysis routes return beside the library's shapes: the
service's RequestMisses and Regret (the library's views, and what the host
adds), and Shadows, still a dict beside its model (app/pool/views/__init__.py
says why)."""

from __future__ import annotations

from typing import Any, NotRequired

from pydantic import Field

from app.pool.views.base import Out
from blockpool.analysis.views import RegretView, RequestMissesView
from blockpool.common.shapes import shape


@shape
class RequestMisses(RequestMissesView):
    """One request's blocks: hit, or the reason each missed."""

    worker: dict[str, Any] | None


@shape
class Regret(RegretView):
    """Evicted blocks asked for again: ratio, gaps, top prefixes, latest."""

    worker: dict[str, Any] | None
    requests_reason: NotRequired[str | None]
    """why owner_request / last_request are null (a mirror is told blocks without the requests that made them); null where they are known"""  # noqa: E501 one line: the description


class Shadows(Out):
    """What-if pools: other capacities and free orders, over the same span."""

    enabled: bool
    real: dict[str, Any] | None = None
    shadows: list[dict[str, Any]] = []
    curve: dict[str, list[dict[str, Any]]] = {}
    mode: str | None = Field(default=None, description="where the shadows run")
    running: bool | None = None
    since: float | None = None
    updated: float | None = None
    lag_accesses: int | None = None
    sent_accesses: int | None = None
    applied_accesses: int | None = None
    dropped_accesses: int | None = None
    resyncs: int | None = None
    error: str | None = None
    worker: dict[str, Any] | None = None
    fed: dict[str, Any] | None = Field(
        default=None,
        description="on a mirror, how the shadows are fed: from the engine's requests' hash "
        "chains, in its free order (text, free_order, requests_fed, not_fed); null on a "
        "served pool (its own requests)",
    )
