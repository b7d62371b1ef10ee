"""The budgets a stream muxer asks of whoever accounts for resources (yamux and QUIC alike).

A muxer declares what it needs of the accounting and nothing more, as go-yamux's
``MemoryManager`` interface (a subset of go-libp2p's resource scopes) does: a connection budget
that lends each stream a budget of its own, and a stream budget that received bytes are reserved
from as they arrive and released to as the application reads them. The resource manager's
connection and stream scopes (``volunteer.net.resources``) satisfy these protocols structurally;
the muxers never import it. Each muxer's own ``budget.py`` adds what only it asks for.
"""

from __future__ import annotations

from typing import Protocol


class StreamBudget(Protocol):
    """What one stream's unread bytes are reserved from."""

    def reserve_memory(self, amount: int, *, now: float) -> bool:
        """Reserve ``amount`` bytes the stream buffers; False (refusal counted) past a limit."""
        ...

    def release_memory(self, amount: int) -> None:
        """Give back ``amount`` bytes the application has read."""
        ...

    def close(self) -> None:
        """Give back everything the stream still holds (idempotent)."""
        ...


class ConnectionBudget(Protocol):
    """What one connection's streams are opened against."""

    def open_stream(self, inbound: bool, *, now: float) -> StreamBudget | None:
        """A budget for a new stream with its stream slot taken, or None (refused: reset it)."""
        ...

    def close(self) -> None:
        """Give back the connection's own allotment (the connection is over)."""
        ...


__all__ = ["ConnectionBudget", "StreamBudget"]
