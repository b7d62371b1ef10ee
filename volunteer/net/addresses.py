"""Which addresses a Host advertises: its announce list or its listen addresses made concrete,
plus what its services add (relay circuits), and which of those are worth sharing with whom.

Every address has a *scope*: loopback (this machine), link-local (this link, and only with the
interface's zone), private (a LAN: RFC 1918, the shared 100.64/10, IPv6 unique-local) or public.
An address is usable across a connection whose far end can route to it: a loopback address only
to a peer that reached us over loopback (a loopback-only testnet, or two volunteers on one
machine), a link-local one never (we would have to know the zone), the others always (a private
address may be dialled from the same LAN; ``dialing`` staggers the attempts so one that never
answers costs little). ``for_peer`` applies that rule, both to what we send (identify, the DHT's
own contact) and to what a peer tells us (its identify, the contacts in its DHT replies), so a
peer's loopback address never reaches our peerstore unless we both sit on the same loopback.

Pure functions of the addresses they are given (``concrete`` asks the OS for this machine's
interface addresses, nothing else); the Host's ``addrs``, ``shareable_addrs`` and ``addrs_for``
are thin calls into here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from .interfaces import interface_ipv4_addrs, lan_ipv6_addrs
from .multiaddr import Multiaddr

LOOPBACK = "loopback"
LINK_LOCAL = "link-local"
PRIVATE = "private"
PUBLIC = "public"

# A LAN's own ranges. Not Python's ``is_private``, which also counts the documentation ranges
# (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) that the NAT rig uses as its
# internet.
PRIVATE_NETS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7",
))


def advertised(announce: Sequence[Multiaddr], listen_addrs: Sequence[Multiaddr], extras: Iterable[Multiaddr]) -> list[Multiaddr]:
    """``announce`` if given, else ``listen_addrs`` with 0.0.0.0/:: expanded; then ``extras``
    (what services advertise), each address once, in that order."""
    if announce:
        base = list(announce)
    else:
        base = []
        for addr in listen_addrs:
            for concrete in expand_unspecified(addr):
                if concrete not in base:
                    base.append(concrete)
    for extra in list(extras):
        if extra not in base:
            base.append(extra)
    return base


def ip_scope(ip: str) -> str | None:
    """The scope of an IP address's text (see the module docstring); None if it is not one."""
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified:
        return LOOPBACK
    if address.is_link_local:
        return LINK_LOCAL
    if any(address in net for net in PRIVATE_NETS if net.version == address.version):
        return PRIVATE
    return PUBLIC


def scope_of(addr: Multiaddr) -> str | None:
    """The scope of the IP ``addr`` starts with (a relayed address: its relay's); None for an
    address that names no IP (memory, DNS), which no rule here limits."""
    components = addr.components
    if not components or components[0][0] not in ("ip4", "ip6"):
        return None
    return ip_scope(addr.value_at(0))


def usable_across(addr: Multiaddr, via: Multiaddr | None) -> bool:
    """Whether ``addr`` means anything to the far end of a connection at ``via`` (our side's view
    of the peer's address; None: a peer we know nothing of, as anyone on the internet)."""
    return scope_usable_across(scope_of(addr), via)


def scope_usable_across(scope: str | None, via: Multiaddr | None) -> bool:
    """``usable_across`` for an address whose scope (``scope_of``) is already known."""
    if scope == LINK_LOCAL:
        return False
    if scope == LOOPBACK:
        return via is not None and scope_of(via) in (LOOPBACK, None)
    return True


def for_peer(addrs: Iterable[Multiaddr], via: Multiaddr | None) -> list[Multiaddr]:
    """``addrs`` without those the peer at ``via`` cannot use (see ``usable_across``): what we
    tell that peer about ourselves, and what we keep of what it tells us."""
    return [a for a in addrs if usable_across(a, via)]


def shareable(addrs: list[Multiaddr]) -> list[Multiaddr]:
    """``addrs`` without link-local ones, and without loopback ones when there is anything else
    (a peer dialing our 127.0.0.1 would reach itself; a loopback-only node has nothing else)."""
    addrs = [a for a in addrs if scope_of(a) != LINK_LOCAL]
    outside = [a for a in addrs if not is_loopback(a)]
    return outside or addrs


def is_loopback(addr: Multiaddr) -> bool:
    """Whether ``addr`` starts with a loopback IP (127.0.0.0/8 or ::1)."""
    return scope_of(addr) == LOOPBACK


def is_private(addr: Multiaddr) -> bool:
    """Whether ``addr`` starts with a LAN's IP (RFC 1918, 100.64/10, fc00::/7)."""
    return scope_of(addr) == PRIVATE


def expand_unspecified(addr: Multiaddr) -> list[Multiaddr]:
    """Replace 0.0.0.0 / :: with this machine's addresses: loopback, then those of its interfaces
    (``interfaces``: never the hostname's resolution, which Debian points at 127.0.1.1; for ::,
    global and unique-local IPv6 ones, never link-local)."""
    components = addr.components
    if not components or components[0][1] not in ("0.0.0.0", "::"):
        return [addr]
    name, ip_text = components[0][0], addr.value_at(0)
    hosts = ["::1", *lan_ipv6_addrs()] if name == "ip6" else ["127.0.0.1", *interface_ipv4_addrs()]
    rest = str(addr)[len(f"/{name}/{ip_text}") :]
    return [Multiaddr(f"/{name}/{ip}{rest}") for ip in dict.fromkeys(hosts)]


__all__ = ["LINK_LOCAL", "LOOPBACK", "PRIVATE", "PUBLIC", "advertised", "expand_unspecified", "for_peer",
           "ip_scope", "is_loopback", "is_private", "scope_of", "scope_usable_across", "shareable", "usable_across"]
