"""What a QUIC connection asks of whoever accounts for resources, and nothing more.

As yamux does (``net/yamux/budget.py``, after go-yamux's ``MemoryManager``), the QUIC transport
declares the budget it needs instead of importing the resource manager: pending-handshake slots
shared per source address (with TCP's: a flood of Initials takes no more than a flood of SYNs), a
connection budget that lends each stream a budget of its own, and a stream budget that received
bytes are reserved from until the application reads them. ``volunteer.net.resources`` satisfies
these protocols structurally; the composer (``net/stack.py``'s ``open_stack``, and the Host, which
attaches a connection's budget once the peer is known) hands them in. Without one (a transport
built alone) nothing is accounted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from ...multiaddr import Multiaddr

Slot = TypeVar("Slot")


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


class HandshakeSlots(Protocol[Slot]):
    """Pending-handshake slots, shared per source address by every transport of a Host."""

    def open_handshake(self, remote: "Multiaddr", *, now: float) -> Slot | None:
        """A slot for a handshake from ``remote``, or None (that address's share or the global
        cap is taken; the refusal is counted by whoever keeps the slots)."""
        ...

    def close_handshake(self, slot: Slot) -> None:
        """The handshake ended (either way): give its slot back."""
        ...


__all__ = ["ConnectionBudget", "HandshakeSlots", "StreamBudget"]
