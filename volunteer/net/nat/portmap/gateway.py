"""Where NAT-PMP and PCP requests go: the IPv4 default gateway, read from the routing table.

Linux lists its routes in ``/proc/net/route`` (hexadecimal, little-endian); the default route is
the one with destination and mask 0. Other systems give no such file: there NAT-PMP and PCP are
not tried, and UPnP IGD (which finds routers by SSDP multicast) still is.
"""

from __future__ import annotations

import ipaddress
import struct

ROUTE_TABLE = "/proc/net/route"
RTF_UP, RTF_GATEWAY = 0x1, 0x2
MAX_ROUTE_LINES = 4096  # a routing table is read this far, no further


def parse_default_gateway(text: str) -> str | None:
    """The gateway of the first default route that is up, from ``/proc/net/route``'s text."""
    for line in text.splitlines()[1:MAX_ROUTE_LINES]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            destination, gateway, flags, mask = (int(fields[i], 16) for i in (1, 2, 3, 7))
        except ValueError:
            continue
        if destination == 0 and mask == 0 and flags & RTF_UP and flags & RTF_GATEWAY and gateway:
            return str(ipaddress.IPv4Address(struct.pack("<I", gateway & 0xFFFFFFFF)))
    return None


def default_gateway() -> str | None:
    """This machine's IPv4 default gateway, or None (no default route, or no routing table to read)."""
    try:
        with open(ROUTE_TABLE) as table:
            return parse_default_gateway(table.read(1 << 20))
    except OSError:
        return None


__all__ = ["default_gateway", "parse_default_gateway"]
