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
    observed: Multiaddr  # /ip4/X/tcp/Y as the observer sees us
    at: float


def _ip_port(addr: Multiaddr) -> tuple[str, int] | None:
    components = addr.components
    if len(components) >= 2 and components[0][0] in ("ip4", "ip6") and components[1][0] == "tcp":
        return addr.value_at(0), int(addr.value_at(1))
    return None


class ObservedAddrs:
    """Bounded record of observations, one per observer (the newest wins)."""

    def __init__(self) -> None:
        self._by_observer: OrderedDict[PeerID, Observation] = OrderedDict()

    def record(self, observer: PeerID, observer_addr: Multiaddr, local_addr: Multiaddr, observed: Multiaddr, now: float) -> None:
        """Note what ``observer`` (at ``observer_addr``) sees for our connection from ``local_addr``."""
        if observed.is_relayed() or observer_addr.is_relayed():
            return  # a relay's view of a circuit says nothing about our NAT
        observer_end, local_end = _ip_port(observer_addr), _ip_port(local_addr)
        if observer_end is None or local_end is None or _ip_port(observed) is None:
            return
        self._by_observer.pop(observer, None)
        self._by_observer[observer] = Observation(observer, observer_end[0], local_end[1], observed.without_peer_id(), now)
        while len(self._by_observer) > MAX_OBSERVATIONS:
            self._by_observer.popitem(last=False)

    def _fresh(self, now: float, local_port: int | None) -> list[Observation]:
        return [
            o for o in self._by_observer.values()
            if now - o.at <= OBSERVATION_TTL and (local_port is None or o.local_port == local_port)
        ]

    def mapping(self, now: float, local_port: int | None = None) -> MappingType:
        """Mapping type for connections from ``local_port`` (our listen port, usually)."""
        observations = self._fresh(now, local_port)
        by_ip: dict[str, set[tuple[str, int]]] = {}
        for o in observations:
            endpoint = _ip_port(o.observed)
            if endpoint is not None:  # record() keeps only /ip/tcp observations
                by_ip.setdefault(o.observer_ip, set()).add(endpoint)
        if len(by_ip) < MIN_OBSERVERS:
            return MappingType.UNKNOWN
        seen = set().union(*by_ip.values())
        return MappingType.ENDPOINT_INDEPENDENT if len(seen) == 1 else MappingType.ENDPOINT_DEPENDENT

    def candidates(self, now: float, local_port: int | None = None, limit: int = 4) -> list[Multiaddr]:
        """Our external addresses as observed, most-reported first (for hole punching)."""
        counts: dict[Multiaddr, int] = {}
        for o in self._fresh(now, local_port):
            counts[o.observed] = counts.get(o.observed, 0) + 1
        return sorted(counts, key=lambda addr: -counts[addr])[:limit]

    def external_addrs(self, now: float, listen_addrs: Sequence[Multiaddr], limit: int = limits.DCUTR_MAX_PUNCH_ADDRS) -> list[Multiaddr]:
        """What we tell a peer to dial for a hole punch: observed external addresses of our TCP
        listen ports (of any port when we listen on none), most-reported first, at most ``limit``."""
        ports: list[int | None] = [int(p) for p in (a.value_for("tcp") for a in listen_addrs) if p]
        addrs: list[Multiaddr] = []
        for port in ports or [None]:
            addrs += [a for a in self.candidates(now, port) if a not in addrs]
        return addrs[:limit]

    def __len__(self) -> int:
        return len(self._by_observer)
