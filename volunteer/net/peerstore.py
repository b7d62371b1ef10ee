"""What the Host knows about other peers: addresses, keys, protocols, agent, observed addresses.

Bounded: a peer keeps at most ``MAX_ADDRS_PER_PEER`` addresses and the store at most ``MAX_PEERS``
peers (the least recently updated are forgotten first), so a flood of identify messages or DHT
contacts cannot grow memory without limit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import VolunteerError
from .identity import PeerID, PublicKey
from .multiaddr import Multiaddr

MAX_PEERS = 10_000
MAX_ADDRS_PER_PEER = 32
MAX_PROTOCOLS_PER_PEER = 256


@dataclass
class PeerInfo:
    """Everything known about one peer."""

    peer_id: PeerID
    addrs: list[Multiaddr] = field(default_factory=list)
    public_key: PublicKey | None = None
    protocols: list[str] = field(default_factory=list)
    agent_version: str = ""
    protocol_version: str = ""
    # The address this peer says it sees us at (identify's observedAddr): NAT detection needs it.
    observed_addr: Multiaddr | None = None


class Peerstore:
    """A bounded, LRU-ordered table of PeerInfo."""

    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        self._peers: OrderedDict[PeerID, PeerInfo] = OrderedDict()
        self._max_peers = max_peers

    def __contains__(self, peer: PeerID) -> bool:
        return peer in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def get(self, peer: PeerID) -> PeerInfo | None:
        return self._peers.get(peer)

    def info(self, peer: PeerID) -> PeerInfo:
        """The entry for ``peer``, created if missing; marks it most recently used."""
        entry = self._peers.get(peer)
        if entry is None:
            entry = PeerInfo(peer)
            self._peers[peer] = entry
            while len(self._peers) > self._max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer)
        return entry

    def addrs(self, peer: PeerID) -> list[Multiaddr]:
        entry = self._peers.get(peer)
        return list(entry.addrs) if entry else []

    def add_addrs(self, peer: PeerID, addrs: list[Multiaddr] | tuple[Multiaddr, ...]) -> None:
        """Remember addresses for ``peer`` (stripped of a trailing /p2p/ID), newest first."""
        entry = self.info(peer)
        for addr in addrs:
            addr = addr.without_peer_id() if addr.peer_id == peer else addr
            if addr in entry.addrs:
                entry.addrs.remove(addr)
            entry.addrs.insert(0, addr)
        del entry.addrs[MAX_ADDRS_PER_PEER:]

    def remember_addrs(self, peer: PeerID, addrs: Iterable[bytes | str | Multiaddr]) -> int:
        """Remember addresses someone else vouched for (a DHT declaration, a swarm file), given as
        multiaddrs, their text or their bytes; those that do not parse are skipped. Returns how many
        parsed."""
        parsed = []
        for addr in addrs:
            try:
                parsed.append(addr if isinstance(addr, Multiaddr) else Multiaddr(addr))
            except VolunteerError:  # a bad multiaddr in any encoding
                continue
        if parsed:
            self.add_addrs(peer, parsed)
        return len(parsed)

    def replace_addrs(self, peer: PeerID, addrs: list[Multiaddr]) -> None:
        """Set the peer's addresses to what it announced itself (identify), keeping order."""
        entry = self.info(peer)
        entry.addrs = []
        self.add_addrs(peer, list(reversed(addrs)))

    def peers(self) -> list[PeerID]:
        return list(self._peers)
