"""The memory budget a yamux session needs from whoever accounts for it.

yamux declares what it asks of the accounting and nothing more (``net/budget.py``: the stream
and connection budgets every muxer needs, after go-yamux's ``MemoryManager``), plus a way to count
the refusals a peer's floods cause. The resource manager's connection and stream scopes
(``volunteer.net.resources``) satisfy these protocols; the muxer never imports them, and a session
without a budget (the paired-core tests) accounts for nothing.
"""

from __future__ import annotations

from typing import Protocol

from .. import budget
from ..budget import StreamBudget


class ConnectionBudget(budget.ConnectionBudget, Protocol):
    """What one yamux session's streams are opened against; it also counts the peer's floods."""

    def refuse(self, reason: str, *, now: float) -> None:
        """Count a refusal the peer's own misbehaviour caused (a control-frame flood, say)."""
        ...


__all__ = ["ConnectionBudget", "StreamBudget"]
