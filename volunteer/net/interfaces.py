"""This machine's own addresses, and which of them the internet can route to.

An IPv6 address in global unicast space (2000::/3: every address a provider hands out, the
documentation prefix 2001:db8::/32 included, which the NAT rig uses as its internet) reaches the
internet without translation, so it is both our listen and our external address; link-local,
unique-local (fc00::/7), loopback and IPv4-mapped addresses do not. Reachability itself (a
stateful firewall in front of it) is still for AutoNAT and hole punching to find out.
"""

from __future__ import annotations

import ipaddress
import logging

log = logging.getLogger(__name__)

GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")


def is_global_v6(ip: str) -> bool:
    """Whether ``ip`` is an IPv6 address in global unicast space (see the module docstring)."""
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    return isinstance(address, ipaddress.IPv6Address) and address in GLOBAL_UNICAST_V6


def global_ipv6_addrs() -> list[str]:
    """This machine's global unicast IPv6 addresses, each once, in interface order."""
    try:
        import ifaddr
    except ImportError:  # the mDNS dependency brings it; without it we only miss IPv6
        return []
    found: list[str] = []
    try:
        adapters = ifaddr.get_adapters()
    except OSError as exc:
        log.info("cannot list network interfaces: %s", exc)
        return []
    for adapter in adapters:
        for ip in adapter.ips:
            if ip.is_IPv6 and is_global_v6(ip.ip[0]) and ip.ip[0] not in found:
                found.append(ip.ip[0])
    return found


def has_global_ipv6() -> bool:
    """Whether this machine has an IPv6 address the internet can route to."""
    return bool(global_ipv6_addrs())


def default_listen_addrs() -> list[str]:
    """What a volunteer listens on by default: TCP and QUIC on every IPv4 address, and on every
    IPv6 one too when the machine has a global IPv6 address (any port: the OS picks)."""
    addrs = ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"]
    if has_global_ipv6():
        addrs += ["/ip6/::/tcp/0", "/ip6/::/udp/0/quic-v1"]
    return addrs


__all__ = ["default_listen_addrs", "global_ipv6_addrs", "has_global_ipv6", "is_global_v6"]
