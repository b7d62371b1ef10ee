"""Who may make the expert server hold what: request-byte budgets and backward authorization.

Pure bookkeeping (no trio, no clock reads: callers pass ``now``), used by ``ExpertServer``:

- ``RequestBudget``: a call reserves the payload bytes its header announces before a payload
  byte is read, per peer and server-wide, and releases them when it ends. A peer that announces
  big tensors and stalls holds only its own share; everyone else keeps being served.
- ``ForwardRecord``: which peer ran forward on which expert, and when. A backward steps the
  expert's optimizer, so it is accepted only from a peer that ran forward on that expert within
  ``backward_window``; the record is an LRU of at most ``max_forward_records`` pairs.

The server counts refusals by reason (``ExpertServer.refusals``: ``{reason: count}``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

from .config import DEFAULT_CONFIG, ExpertsConfig

# Refusal reasons, as counted and shown in status output.
PEER_BYTES = "peer_request_bytes"
TOTAL_BYTES = "total_request_bytes"
BACKWARD_WITHOUT_FORWARD = "backward_without_forward"


class RequestBudget:
    """Request bytes in flight, per peer and in all, bounded by ``ExpertsConfig``."""

    def __init__(self, config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self.per_peer_limit = config.max_request_bytes_per_peer
        self.total_limit = config.max_request_bytes_total
        self.total = 0
        self._by_peer: dict[Hashable, int] = {}

    def held_by(self, peer: Hashable) -> int:
        """Bytes reserved now by ``peer``'s calls."""
        return self._by_peer.get(peer, 0)

    def reserve(self, peer: Hashable, nbytes: int) -> str | None:
        """Reserve ``nbytes`` for one call of ``peer``: None when granted, else the refusal reason
        (nothing is reserved then)."""
        held = self._by_peer.get(peer, 0)
        if held + nbytes > self.per_peer_limit:
            return PEER_BYTES
        if self.total + nbytes > self.total_limit:
            return TOTAL_BYTES
        self._by_peer[peer] = held + nbytes
        self.total += nbytes
        return None

    def release(self, peer: Hashable, nbytes: int) -> None:
        """Give back what ``reserve`` granted (once per granted call)."""
        left = self._by_peer.get(peer, 0) - nbytes
        if left > 0:
            self._by_peer[peer] = left
        else:
            self._by_peer.pop(peer, None)  # no entry per idle peer: the table is bounded by calls
        self.total -= nbytes


class ForwardRecord:
    """When each (peer, expert uid) pair last ran forward; bounded, least recently used dropped."""

    def __init__(self, config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self.window = config.backward_window
        self.capacity = config.max_forward_records
        self._last: OrderedDict[tuple[Hashable, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def forwarded(self, peer: Hashable, uid: str, *, now: float) -> None:
        """Remember that ``peer`` ran forward on ``uid`` at ``now``."""
        key = (peer, uid)
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)

    def may_backward(self, peer: Hashable, uid: str, *, now: float) -> bool:
        """Whether ``peer`` ran forward on ``uid`` within the backward window before ``now``."""
        last = self._last.get((peer, uid))
        if last is None:
            return False
        if now - last > self.window:
            del self._last[(peer, uid)]
            return False
        return True


__all__ = ["BACKWARD_WITHOUT_FORWARD", "ForwardRecord", "PEER_BYTES", "RequestBudget", "TOTAL_BYTES"]
