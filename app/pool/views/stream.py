"""What the stream's REST route returns."""

from __future__ import annotations

from pydantic import Field

from app.pool.views.base import Out


class Ticket(Out):
    """A single-use credential for the stream's websocket."""

    ticket: str = Field(description="send as the subprotocol 'ticket.<ticket>' (or ?ticket=)")
    expires_in: float = Field(description="seconds it stays valid")
