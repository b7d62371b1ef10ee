"""What other peers see of us: observed addresses from identify, and the NAT mapping they imply.

Each peer we reach directly tells us (identify's observedAddr) the address our connection comes
from, as the world sees it. If peers at different addresses all see the same external ip:port
for connections from our listen port, our NAT maps endpoint-independently and that address can
be hole-punched; if they see different ports, the mapping depends on the destination
(a "symmetric" NAT) and hole punching will not work. Pure: ``now`` is passed in.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from .. import limits
from ..identity import PeerID
from ..multiaddr import Multiaddr

MAX_OBSERVATIONS = limits.MAX_OBSERVATIONS
OBSERVATION_TTL = limits.OBSERVATION_TTL
MIN_OBSERVERS = limits.MIN_OBSERVERS


class MappingType(enum.Enum):
    """How our NAT maps a listen port, as far as the observations tell."""

    UNKNOWN = "unknown"
    ENDPOINT_INDEPENDENT = "endpoint-independent"  # hole-punchable
    ENDPOINT_DEPENDENT = "endpoint-dependent"  # symmetric: hole punching fails


@dataclass
class Observation:
    """What one observer told us about one of our connections."""

    observer: PeerID
    observer_ip: str
    local_port: int  # our port on that connection
    observed: Multiaddr  # /ip4/X/tcp/Y or /ip4/X/udp/Y/quic-v1 as the observer sees us
    at: float
    transport: str = "tcp"  # "tcp" or "quic": ports of different transports are different mappings


def endpoint_of(addr: Multiaddr) -> tuple[str, str, int] | None:
    """(transport, ip, port) of a direct /ip/tcp or /ip/udp/quic-v1 address; None otherwise."""
    components = addr.components
    if len(components) < 2 or components[0][0] not in ("ip4", "ip6"):
        return None
    if components[1][0] == "tcp":
        return "tcp", addr.value_at(0), int(addr.value_at(1))
    if components[1][0] == "udp" and len(components) >= 3 and components[2][0] == "quic-v1":
        return "quic", addr.value_at(0), int(addr.value_at(1))
    return None


def _ip_port(addr: Multiaddr) -> tuple[str, int] | None:
    found = endpoint_of(addr)
    return (found[1], found[2]) if found is not None else None


def probe_target(peer_addrs: Sequence[Multiaddr], remote: Multiaddr, transport: str) -> Multiaddr | None:
    """Which of a peer's advertised addresses to dial over ``transport`` to learn how it sees us
    there: one at the IP we already reach it on (the same machine, the same path through NATs)."""
    reached = endpoint_of(remote)
    if reached is None:
        return None
    for addr in peer_addrs:
        found = endpoint_of(addr.without_peer_id())
        if found is not None and found[0] == transport and found[1] == reached[1]:
            return addr.without_peer_id()
    return None


class ObservedAddrs:
    """Bounded record of observations, one per observer (the newest wins)."""

    def __init__(self) -> None:
        self._by_observer: OrderedDict[tuple[PeerID, str], Observation] = OrderedDict()

    def record(self, observer: PeerID, observer_addr: Multiaddr, local_addr: Multiaddr, observed: Multiaddr, now: float) -> None:
        """Note what ``observer`` (at ``observer_addr``) sees for our connection from ``local_addr``."""
        if observed.is_relayed() or observer_addr.is_relayed():
            return  # a relay's view of a circuit says nothing about our NAT
        observer_end, local_end, seen = endpoint_of(observer_addr), endpoint_of(local_addr), endpoint_of(observed)
        if observer_end is None or local_end is None or seen is None or not observer_end[0] == local_end[0] == seen[0]:
            return  # a peer that reports a TCP address for a QUIC connection tells us nothing
        transport = local_end[0]
        key = (observer, transport)
        self._by_observer.pop(key, None)
        self._by_observer[key] = Observation(observer, observer_end[1], local_end[2], observed.without_peer_id(), now, transport)
        while len(self._by_observer) > MAX_OBSERVATIONS:
            self._by_observer.popitem(last=False)

    def _fresh(self, now: float, local_port: int | None, transport: str | None = None) -> list[Observation]:
        return [
            o for o in self._by_observer.values()
            if now - o.at <= OBSERVATION_TTL and (local_port is None or o.local_port == local_port)
            and (transport is None or o.transport == transport)
        ]

    def transports(self, now: float) -> set[str]:
        """The transports some peer has recently told us our address for."""
        return {o.transport for o in self._fresh(now, None)}

    def mapping(self, now: float, local_port: int | None = None, transport: str = "tcp") -> MappingType:
        """Mapping type for ``transport`` connections from ``local_port`` (our listen port, usually)."""
        observations = self._fresh(now, local_port, transport)
        by_ip: dict[str, set[tuple[str, int]]] = {}
        for o in observations:
            endpoint = _ip_port(o.observed)
            if endpoint is not None:  # record() keeps only /ip/tcp and /ip/udp/quic-v1 observations
                by_ip.setdefault(o.observer_ip, set()).add(endpoint)
        if len(by_ip) < MIN_OBSERVERS:
            return MappingType.UNKNOWN
        seen = set().union(*by_ip.values())
        return MappingType.ENDPOINT_INDEPENDENT if len(seen) == 1 else MappingType.ENDPOINT_DEPENDENT

    def candidates(self, now: float, local_port: int | None = None, limit: int = 4, transport: str | None = None) -> list[Multiaddr]:
        """Our external addresses as observed, most-reported first (for hole punching)."""
        counts: dict[Multiaddr, int] = {}
        for o in self._fresh(now, local_port, transport):
            counts[o.observed] = counts.get(o.observed, 0) + 1
        return sorted(counts, key=lambda addr: -counts[addr])[:limit]

    def external_addrs(self, now: float, listen_addrs: Sequence[Multiaddr], limit: int = limits.DCUTR_MAX_PUNCH_ADDRS) -> list[Multiaddr]:
        """What we tell a peer to dial for a hole punch: observed external addresses of our TCP
        and QUIC listen ports (TCP: of any port when we listen on none), most-reported first, at
        most ``limit`` per transport, TCP first."""
        listening: dict[str, list[int | None]] = {"tcp": [], "quic": []}
        for addr in listen_addrs:
            found = endpoint_of(addr)
            if found is not None:
                listening[found[0]].append(found[2])
        if not listening["tcp"]:
            listening["tcp"] = [None]
        addrs: list[Multiaddr] = []
        for transport, ports in listening.items():
            mine: list[Multiaddr] = []
            for port in ports:
                mine += [a for a in self.candidates(now, port, transport=transport) if a not in mine]
            addrs += mine[:limit]
        return addrs

    def missing(self, now: float, listen_addrs: Sequence[Multiaddr]) -> set[str]:
        """Transports we listen on that no peer has recently told us our address for: a hole
        punch over them has nothing to offer the other side until someone does."""
        listening = {found[0] for found in map(endpoint_of, listen_addrs) if found is not None}
        return listening - self.transports(now)

    def __len__(self) -> int:
        return len(self._by_observer)


def port_kept_guess(observed: Sequence[Multiaddr], listen_addrs: Sequence[Multiaddr]) -> list[Multiaddr]:
    """Our QUIC address as a NAT that keeps ports would map it, when no peer has told us one yet
    but one told us our external IPv4 address over TCP: that IP at our QUIC listen port. A fresh
    volunteer's QUIC observation can come after its first punch starts (a loaded machine's
    handshake with the relay, or none at all where UDP is dropped); without a QUIC address in the
    CONNECT the peer cannot aim birthday probes at us. Only a punch candidate, never advertised."""
    found = [endpoint_of(a) for a in observed]
    if any(f is not None and f[0] == "quic" for f in found):
        return []
    ips = [f[1] for f in found if f is not None and f[0] == "tcp" and ":" not in f[1]]
    ports = [f[2] for f in map(endpoint_of, listen_addrs) if f is not None and f[0] == "quic" and ":" not in f[1]]
    if not ips or not ports or not ports[0]:
        return []
    return [Multiaddr(f"/ip4/{ips[0]}/udp/{ports[0]}/quic-v1")]
