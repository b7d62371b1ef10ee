"""How much of our traffic went direct, as iroh exports it (``direct_connection_rate``,
``direct_data_rate``): the share of peer connections that ended direct and the share of bytes
that went over direct connections. Pure bookkeeping, fed by the NAT manager from the Host's
connection events; the swarm's own infrastructure (relays, entry points) is left out, since
we always reach it directly and it would flatter the figure.

A *session* with a peer lasts from its first connection to its last one closing; it *ended
direct* when a direct connection (plain or hole-punched) carried it at the end, or at any time
after its relayed start (a punched connection that later closed with the peer leaving counts).
A session still open counts as it stands now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from ..identity import PeerID



class DirectView(TypedDict):
    """``DirectShare.view()``: the shares of peer sessions and bytes that went direct."""

    direct_connection_share: float | None
    direct_data_share: float | None
    peer_sessions: int
    peer_sessions_direct: int
    bytes_direct: int
    bytes_relayed: int


@dataclass
class DirectShare:
    """Sessions and bytes, direct and relayed (see the module docstring)."""

    infrastructure: set[PeerID] = field(default_factory=set)
    sessions: int = 0  # sessions that ended
    ended_direct: int = 0
    bytes_direct: int = 0  # of connections that closed
    bytes_relayed: int = 0
    _open: dict[PeerID, bool] = field(default_factory=dict)  # open sessions: direct yet?

    def connected(self, peer: PeerID, direct: bool) -> None:
        """A connection to ``peer`` came up (``direct``: not through a relay)."""
        if peer in self.infrastructure:
            return
        self._open[peer] = self._open.get(peer, False) or direct

    def closed(self, peer: PeerID, direct: bool, nbytes: int, *, last: bool) -> None:
        """A connection to ``peer`` that carried ``nbytes`` closed; ``last``: none to it remain."""
        if peer in self.infrastructure:
            return
        if direct:
            self.bytes_direct += nbytes
        else:
            self.bytes_relayed += nbytes
        if last and peer in self._open:
            self.sessions += 1
            self.ended_direct += int(self._open.pop(peer))

    def view(self, live: Iterable[tuple[PeerID, bool, int]]) -> DirectView:
        """The shares, counting the connections open now (``live``: peer, direct, bytes so far,
        one row per connection): ``direct_connection_share`` and ``direct_data_share`` (None
        before there is anything to count), with the counts they come from."""
        sessions, direct_sessions = self.sessions, self.ended_direct
        bytes_direct, bytes_relayed = self.bytes_direct, self.bytes_relayed
        now_direct: dict[PeerID, bool] = {}
        for peer, direct, nbytes in live:
            if peer in self.infrastructure:
                continue
            now_direct[peer] = now_direct.get(peer, False) or direct
            if direct:
                bytes_direct += nbytes
            else:
                bytes_relayed += nbytes
        sessions += len(now_direct)
        direct_sessions += sum(1 for peer, direct in now_direct.items() if direct or self._open.get(peer, False))
        total = bytes_direct + bytes_relayed
        return {
            "direct_connection_share": round(direct_sessions / sessions, 4) if sessions else None,
            "direct_data_share": round(bytes_direct / total, 4) if total else None,
            "peer_sessions": sessions,
            "peer_sessions_direct": direct_sessions,
            "bytes_direct": bytes_direct,
            "bytes_relayed": bytes_relayed,
        }


__all__ = ["DirectShare"]
