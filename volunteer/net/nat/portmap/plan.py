"""The decisions of router port mapping, pure: which ports to map, by which protocol, when to renew,
when to try again, and which mapped addresses may be advertised. No sockets, no clock: ``now`` is
passed in.

A mapping is asked for each IPv4 port we listen on (TCP, and the UDP port of QUIC), by the first
protocol the gateway speaks in our order of preference (PCP, then NAT-PMP, then UPnP IGD), renewed
half-way through its lease, and deleted when we leave. A mapped address is only a *candidate*
until an AutoNAT server has dialled it back from outside: a router may grant a mapping on a WAN
address that is itself behind another NAT (a carrier's), and advertising that would send peers
to a dead end.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ... import limits
from ...addresses import PUBLIC, scope_of
from ...multiaddr import Multiaddr

PROTOCOLS = ("pcp", "natpmp", "upnp")  # in order of preference
TRANSPORT_OF_KIND = {"tcp": "tcp", "quic": "udp"}  # what a listen address needs mapped


@dataclass(frozen=True)
class Wanted:
    """One port to map: ``kind`` is the listen address's ("tcp" or "quic"), ``transport`` the IP
    protocol the router maps ("tcp" or "udp")."""

    kind: str
    internal_port: int

    @property
    def transport(self) -> str:
        return TRANSPORT_OF_KIND[self.kind]


@dataclass(frozen=True)
class Lease:
    """A mapping a router granted us."""

    protocol: str  # "pcp", "natpmp" or "upnp"
    wanted: Wanted
    external_ip: str
    external_port: int
    lifetime: float  # seconds; 0 from UPnP means "until deleted"
    granted_at: float

    @property
    def renew_at(self) -> float:
        """When to ask again: half-way through the lease, never sooner than PORTMAP_MIN_RENEW (an
        indefinite UPnP lease is renewed as if it were PORTMAP_LIFETIME long: the router may have
        rebooted and forgotten it)."""
        lifetime = self.lifetime if self.lifetime > 0 else limits.PORTMAP_LIFETIME
        return self.granted_at + max(limits.PORTMAP_MIN_RENEW, lifetime / 2)

    @property
    def addr(self) -> Multiaddr:
        """The external address this lease makes dialable (once confirmed)."""
        family = "ip6" if ":" in self.external_ip else "ip4"
        if self.wanted.kind == "quic":
            return Multiaddr(f"/{family}/{self.external_ip}/udp/{self.external_port}/quic-v1")
        return Multiaddr(f"/{family}/{self.external_ip}/tcp/{self.external_port}")


def wanted_ports(listen_addrs: Iterable[Multiaddr]) -> list[Wanted]:
    """The ports worth mapping: IPv4 TCP and QUIC listen addresses on the wildcard or on a
    non-loopback address (a router maps only what reaches it from the LAN); each once."""
    found: list[Wanted] = []
    for addr in listen_addrs:
        names = addr.protocols()
        if len(names) < 2 or names[0] != "ip4":
            continue
        ip = ipaddress.IPv4Address(addr.value_at(0))
        if ip.is_loopback or ip.is_link_local:
            continue
        if names[1] == "tcp" and len(names) == 2:
            kind = "tcp"
        elif names[1] == "udp" and names[2:] == ["quic-v1"]:
            kind = "quic"
        else:
            continue
        wanted = Wanted(kind, int(addr.value_at(1)))
        if wanted not in found:
            found.append(wanted)
    return found


def choose_protocol(available: Sequence[str]) -> str | None:
    """The protocol to map with, among those the gateway answered: PCP, then NAT-PMP, then UPnP."""
    for protocol in PROTOCOLS:
        if protocol in available:
            return protocol
    return None


def settled(outcomes: dict[str, bool | None]) -> tuple[bool, str | None]:
    """Whether parallel probes of the protocols are settled, and the winner: the most preferred
    protocol that answered once every more preferred one has failed (``outcomes``: protocol ->
    True answered, False failed, None still running; protocols not in it were not tried)."""
    for protocol in PROTOCOLS:
        if protocol not in outcomes:
            continue
        outcome = outcomes[protocol]
        if outcome is None:
            return False, None
        if outcome:
            return True, protocol
    return True, None


@dataclass
class PortMapPlan:
    """One node's port-mapping bookkeeping (see the module docstring)."""

    leases: dict[Wanted, Lease] = field(default_factory=dict)
    confirmed: set[Multiaddr] = field(default_factory=set)
    refused: set[Multiaddr] = field(default_factory=set)  # dialled back and not reached
    # every AutoNAT server asked refused to dial it (another IP than ours, say): no evidence will
    # come, so it is no candidate (a hole punch must not wait for it) until the lease changes
    unchecked: set[Multiaddr] = field(default_factory=set)
    attempted: set[Wanted] = field(default_factory=set)  # ports a try has been made for
    protocol: str | None = None  # what the gateway speaks, once probed
    failures: int = 0
    last_try: float | None = None
    error: str = ""  # why the last try failed, for status and doctor

    # --- trying ---------------------------------------------------------------------------
    def next_try_at(self) -> float | None:
        """When a failed try may be made again: PORTMAP_RETRY_INTERVAL doubling with each failure
        in a row, at most PORTMAP_MAX_BACKOFF; None before the first try."""
        if self.last_try is None:
            return None
        if not self.failures:
            return self.last_try + limits.PORTMAP_RETRY_INTERVAL
        return self.last_try + min(limits.PORTMAP_MAX_BACKOFF, limits.PORTMAP_RETRY_INTERVAL * 2 ** (self.failures - 1))

    def should_try(self, wanted: Sequence[Wanted], now: float, *, network_changed: bool = False) -> bool:
        """Whether to (re)try mapping now: at once for a port never tried (the first time, a port
        we started listening on since), when a wanted port has no lease and the back-off allows
        it, or after a network change (at most every PORTMAP_RETRY_INTERVAL)."""
        if not wanted:
            return False
        if self.last_try is None or any(w not in self.attempted for w in wanted):
            return True
        due = self.next_try_at()
        if due is not None and now < due and not (network_changed and now - self.last_try >= limits.PORTMAP_RETRY_INTERVAL):
            return False
        return network_changed or any(w not in self.leases for w in wanted)

    def tried(self, now: float, protocol: str | None, error: str = "", ports: Iterable[Wanted] = ()) -> None:
        """A try for ``ports`` ended: with the gateway speaking ``protocol`` (None: nothing
        answered), and ``error`` when some port could not be mapped."""
        self.attempted.update(ports)
        self.last_try = now
        self.protocol = protocol
        self.error = error
        self.failures = self.failures + 1 if error else 0

    # --- leases ----------------------------------------------------------------------------
    def granted(self, lease: Lease) -> bool:
        """Keep ``lease``; True when its external address is new (it needs confirming)."""
        before = self.leases.get(lease.wanted)
        self.leases[lease.wanted] = lease
        return before is None or before.addr != lease.addr

    def lost(self, wanted: Wanted) -> Lease | None:
        """Forget the lease of ``wanted`` (a renewal failed, or we unmapped it)."""
        lease = self.leases.pop(wanted, None)
        if lease is not None:
            self.confirmed.discard(lease.addr)
            self.unchecked.discard(lease.addr)
        return lease

    def due_renewals(self, now: float) -> list[Lease]:
        """Leases whose renewal time has come."""
        return [lease for lease in self.leases.values() if lease.renew_at <= now]

    def next_renewal(self) -> float | None:
        """The earliest renewal time of our leases."""
        return min((lease.renew_at for lease in self.leases.values()), default=None)

    # --- confirmation ------------------------------------------------------------------------
    def candidates(self) -> list[Multiaddr]:
        """Mapped addresses not yet dialled back: what to ask AutoNAT servers about. Never one
        on an address the internet cannot route to (the inner router of a double NAT maps onto
        its private 100.64 or RFC 1918 WAN address), nor one every server refused to check."""
        return [lease.addr for lease in self.leases.values()
                if lease.addr not in self.confirmed and lease.addr not in self.refused
                and lease.addr not in self.unchecked and scope_of(lease.addr) == PUBLIC]

    def not_checked(self, addr: Multiaddr) -> None:
        """Every AutoNAT server we asked refused to dial ``addr``: it stops being a candidate."""
        if addr in {lease.addr for lease in self.leases.values()}:
            self.unchecked.add(addr)

    def dialled_back(self, addr: Multiaddr, reached: bool) -> bool:
        """An AutoNAT server reached ``addr`` (or failed to); True when what we advertise changed."""
        if addr not in {lease.addr for lease in self.leases.values()}:
            return False  # a lease that went away meanwhile
        self.unchecked.discard(addr)
        if reached:
            self.refused.discard(addr)
            changed = addr not in self.confirmed
            self.confirmed.add(addr)
            return changed
        self.refused.add(addr)
        return False

    def advertised(self) -> list[Multiaddr]:
        """Mapped addresses an AutoNAT server has reached from outside: the only ones we advertise."""
        return [lease.addr for lease in self.leases.values() if lease.addr in self.confirmed]

    def network_changed(self) -> None:
        """Our addresses or reachability moved: what was refused may be reachable now."""
        self.refused.clear()


__all__ = ["PROTOCOLS", "Lease", "PortMapPlan", "Wanted", "choose_protocol", "settled", "wanted_ports"]
