"""The memory budget a yamux session needs from whoever accounts for it.

yamux declares what it asks of the accounting and nothing more, as go-yamux's ``MemoryManager``
interface (a subset of go-libp2p's resource scopes) does: a connection budget that lends each
stream a budget of its own, and a stream budget that bytes are reserved from as they arrive and
released to as the application reads them. The resource manager's connection and stream scopes
(``volunteer.net.resources``) satisfy these protocols; the muxer never imports them, and a session
without a budget (the paired-core tests) accounts for nothing.
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

    def refuse(self, reason: str, *, now: float) -> None:
        """Count a refusal the peer's own misbehaviour caused (a control-frame flood, say)."""
        ...

    def close(self) -> None:
        """Give back the connection's own allotment (the session is over)."""
        ...


__all__ = ["ConnectionBudget", "StreamBudget"]
