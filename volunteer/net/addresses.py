"""Which addresses a Host advertises: its announce list or its listen addresses made concrete,
plus what its services add (relay circuits), and which of those are worth sharing off-machine.

Pure functions of the addresses they are given (``concrete`` asks the OS for this machine's
addresses, nothing else); the Host's ``addrs`` and ``shareable_addrs`` are thin calls into here.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence

from .interfaces import global_ipv6_addrs
from .multiaddr import Multiaddr


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


def shareable(addrs: list[Multiaddr]) -> list[Multiaddr]:
    """``addrs`` without loopback ones when there is anything else (a peer dialing our 127.0.0.1
    would reach itself)."""
    outside = [a for a in addrs if not is_loopback(a)]
    return outside or addrs


def is_loopback(addr: Multiaddr) -> bool:
    """Whether ``addr`` starts with a loopback IP (127.0.0.0/8 or ::1)."""
    components = addr.components
    if not components or components[0][0] not in ("ip4", "ip6"):
        return False
    ip = addr.value_at(0)
    return ip.startswith("127.") or ip == "::1"


def expand_unspecified(addr: Multiaddr) -> list[Multiaddr]:
    """Replace 0.0.0.0 / :: with this machine's addresses: loopback and, for 0.0.0.0, the
    hostname's; for ::, every global IPv6 address of its interfaces (those are what peers dial;
    resolving the hostname for IPv6 would ask DNS, and block, where /etc/hosts has no answer)."""
    components = addr.components
    if not components or components[0][1] not in ("0.0.0.0", "::"):
        return [addr]
    name, ip_text = components[0][0], addr.value_at(0)
    if name == "ip6":
        hosts = ["::1", *global_ipv6_addrs()]
    else:
        hosts = ["127.0.0.1"]
        try:
            for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM):
                ip = str(info[4][0])
                if ip not in hosts:
                    hosts.append(ip)
        except OSError:
            pass  # no resolvable hostname: loopback alone is still true
    rest = str(addr)[len(f"/{name}/{ip_text}") :]
    return [Multiaddr(f"/{name}/{ip}{rest}") for ip in hosts]


__all__ = ["advertised", "expand_unspecified", "is_loopback", "shareable"]
