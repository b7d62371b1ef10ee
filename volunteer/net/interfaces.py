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
import socket
import time

log = logging.getLogger(__name__)

GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
UNIQUE_LOCAL_V6 = ipaddress.ip_network("fc00::/7")


def is_global_v6(ip: str) -> bool:
    """Whether ``ip`` is an IPv6 address in global unicast space (see the module docstring)."""
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    return isinstance(address, ipaddress.IPv6Address) and address in GLOBAL_UNICAST_V6


def _interface_ips() -> list[str] | None:
    """Every IP address of this machine's interfaces (IPv6 without its zone), in interface
    order; None when they cannot be listed (no ``ifaddr``, or the OS refused)."""
    try:
        import ifaddr
    except ImportError:  # a declared dependency; without it we fall back (see interface_ipv4_addrs)
        return None
    try:
        adapters = ifaddr.get_adapters()
    except OSError as exc:
        log.info("cannot list network interfaces: %s", exc)
        return None
    found: list[str] = []
    for adapter in adapters:
        for ip in adapter.ips:
            text = ip.ip[0].split("%", 1)[0] if ip.is_IPv6 else str(ip.ip)
            if text not in found:
                found.append(text)
    return found


_CACHE_AGE = 5.0  # seconds a listing of our interface addresses is reused by dials
_cached: tuple[float, tuple[str, ...]] | None = None


def own_ips() -> tuple[str, ...]:
    """This machine's interface addresses (as ``_interface_ips``; empty when they cannot be
    listed), listed again at most every few seconds: every dial asks (``dialing.routable``)."""
    global _cached
    now = time.monotonic()
    if _cached is None or now - _cached[0] > _CACHE_AGE:
        _cached = (now, tuple(_interface_ips() or ()))
    return _cached[1]


def global_ipv6_addrs() -> list[str]:
    """This machine's global unicast IPv6 addresses, each once, in interface order."""
    return [ip for ip in _interface_ips() or [] if is_global_v6(ip)]


def lan_ipv6_addrs() -> list[str]:
    """This machine's IPv6 addresses peers can dial: global unicast ones, then unique-local ones
    (fc00::/7, a LAN's own); never link-local (a peer would need our interface's zone) or loopback."""
    ips = _interface_ips() or []
    unique_local = [ip for ip in ips if _in(ip, UNIQUE_LOCAL_V6)]
    return [ip for ip in ips if is_global_v6(ip)] + unique_local


def interface_ipv4_addrs() -> list[str]:
    """This machine's IPv4 addresses peers can dial, from its interfaces: never loopback or
    link-local. Not the hostname's resolution: Debian and Ubuntu map the hostname to 127.0.1.1,
    which would leave a volunteer with no LAN address at all (mDNS and DCUtR need them). Only
    where the interfaces cannot be listed does the hostname stand in, its loopback answers dropped."""
    ips = _interface_ips()
    if ips is None:
        ips = []
        try:
            for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM):
                ips.append(str(info[4][0]))
        except OSError:
            pass  # no resolvable hostname: loopback alone is still true
    found: list[str] = []
    for ip in ips:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv4Address) and not (address.is_loopback or address.is_link_local
                                                               or address.is_unspecified) and ip not in found:
            found.append(ip)
    return found


def _in(ip: str, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    try:
        return ipaddress.ip_address(ip) in network
    except ValueError:
        return False


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


__all__ = ["default_listen_addrs", "own_ips", "global_ipv6_addrs", "has_global_ipv6", "interface_ipv4_addrs", "is_global_v6",
           "lan_ipv6_addrs"]
