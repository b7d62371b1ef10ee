"""A home router's NAT-PMP server for the NAT rig (RFC 6886), mapping onto whatever WAN address
the router has.

Debian's miniupnpd refuses a private or shared WAN address (it wants STUN, and behind a carrier's
filtering NAT its STUN test refuses too), but many home routers behind a carrier NAT map ports
happily and report their 100.64 WAN address as the external one. This is such a router: it
answers the external-address request (opcode 0) with its WAN address and maps UDP (1) and TCP
(2) ports by DNAT rules in the router's own nftables chain ``natpmp`` (``homes.router_ruleset``
with ``natpmp=True`` jumps into it), keeping the suggested port when it is free. A request of
another version (PCP's 2) is answered "unsupported version", as RFC 6887 asks of a NAT-PMP-only
server. Leases are kept as asked (lifetime 0 deletes); nothing expires them in the rig's short
life.

    python -m tests.nat.natpmp_responder LAN_IP WAN_IP WAN_IFNAME [--table rig]

Prints ``ready`` once bound; runs until killed. Bad datagrams are ignored.
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
import time

PORT = 5351
UNSUPPORTED_VERSION, UNSUPPORTED_OPCODE = 1, 5
PROTOCOLS = {1: "udp", 2: "tcp"}


class Mappings:
    """The router's leases: (protocol, internal address, internal port) -> external port."""

    def __init__(self, wan_if: str, table: str) -> None:
        self.wan_if = wan_if
        self.table = table
        self.leases: dict[tuple[str, str, int], int] = {}

    def map(self, proto: str, client: str, internal: int, suggested: int, lifetime: int) -> int:
        key = (proto, client, internal)
        if lifetime == 0:
            self.leases.pop(key, None)
            self._apply()
            return 0
        if key not in self.leases:
            taken = {port for (p, _, _), port in self.leases.items() if p == proto}
            port = suggested or internal
            while port in taken or port < 1024:
                port = 1024 + (port + 1) % 64512
            self.leases[key] = port
            self._apply()
        return self.leases[key]

    def _apply(self) -> None:
        """The chain holds exactly the leases: flushed and refilled in one nft transaction."""
        rules = [f"flush chain ip {self.table} natpmp"]
        rules += [f'add rule ip {self.table} natpmp iifname "{self.wan_if}" {proto} dport {port} dnat to {client}:{internal}'
                  for (proto, client, internal), port in self.leases.items()]
        subprocess.run(["nft", "-f", "-"], input="\n".join(rules) + "\n", text=True, check=True)


def answer(request: bytes, client: str, wan_ip: str, mappings: Mappings, epoch: int) -> bytes | None:
    """The reply to one request from ``client``; None for a datagram that is no request."""
    if len(request) < 2:
        return None
    version, opcode = request[0], request[1]
    if version != 0:
        return struct.pack("!BBHI", 0, 128 + (opcode & 0x7F), UNSUPPORTED_VERSION, epoch)
    if opcode == 0 and len(request) == 2:
        return struct.pack("!BBHI4s", 0, 128, 0, epoch, socket.inet_aton(wan_ip))
    if opcode in PROTOCOLS and len(request) == 12:
        _, _, _, internal, suggested, lifetime = struct.unpack("!BBHHHI", request)
        port = mappings.map(PROTOCOLS[opcode], client, internal, suggested, lifetime)
        return struct.pack("!BBHIHHI", 0, 128 + opcode, 0, epoch, internal, port, lifetime if port else 0)
    if opcode < 128:
        return struct.pack("!BBHI", 0, 128 + opcode, UNSUPPORTED_OPCODE, epoch)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lan_ip")
    parser.add_argument("wan_ip")
    parser.add_argument("wan_if")
    parser.add_argument("--table", default="rig")
    args = parser.parse_args(argv)
    mappings = Mappings(args.wan_if, args.table)
    started = time.monotonic()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.lan_ip, PORT))
    print("ready", flush=True)
    while True:
        request, (client, port) = sock.recvfrom(1100)
        reply = answer(request, client, args.wan_ip, mappings, int(time.monotonic() - started))
        if reply is not None:
            sock.sendto(reply, (client, port))


if __name__ == "__main__":
    sys.exit(main())
