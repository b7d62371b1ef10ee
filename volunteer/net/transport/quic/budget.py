"""What a QUIC connection asks of whoever accounts for resources, and nothing more.

As yamux does (``net/yamux/budget.py``, after go-yamux's ``MemoryManager``), the QUIC transport
declares the budget it needs instead of importing the resource manager: pending-handshake slots
shared per source address (with TCP's: a flood of Initials takes no more than a flood of SYNs),
beside the connection and stream budgets every muxer asks for (``net/budget.py``).
``volunteer.net.resources`` satisfies
these protocols structurally; the composer (``net/stack.py``'s ``open_stack``, and the Host, which
attaches a connection's budget once the peer is known) hands them in. Without one (a transport
built alone) nothing is accounted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

from ...budget import ConnectionBudget, StreamBudget

if TYPE_CHECKING:
    from ...multiaddr import Multiaddr

Slot = TypeVar("Slot")


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
