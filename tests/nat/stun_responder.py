"""A small STUN responder for the NAT rig's internet (RFC 5389 Binding, RFC 5780 CHANGE-REQUEST).

miniupnpd refuses a WAN address in a documentation range (the rig's internet is one) unless it
learns its public address by STUN (``ext_perform_stun``), and its STUN test asks for answers from
another address and port (CHANGE-REQUEST) to tell a full-cone path from a filtering one. So this
responder listens on two addresses and two ports and answers each Binding request from the
socket the request asks for, with XOR-MAPPED-ADDRESS (and MAPPED-ADDRESS, for old clients).

    python -m tests.nat.stun_responder 203.0.113.40 203.0.113.41 [--port 3478 --alt-port 3479]

Prints ``ready`` once every socket is bound; runs until killed. Bad datagrams are ignored.
"""

from __future__ import annotations

import argparse
import selectors
import socket
import struct
import sys

MAGIC = 0x2112A442
BINDING_REQUEST = 0x0001
BINDING_RESPONSE = 0x0101
CHANGE_REQUEST = 0x0003
CHANGE_IP, CHANGE_PORT = 0x4, 0x2
MAX_DATAGRAM = 548  # a Binding request is 20 bytes plus a few attributes


def answer(request: bytes, source: tuple[str, int]) -> tuple[bytes, int] | None:
    """The response to a Binding request from ``source`` and the CHANGE-REQUEST flags it carries;
    None for anything that is not a well-formed Binding request."""
    if len(request) < 20 or len(request) > MAX_DATAGRAM:
        return None
    kind, length, cookie = struct.unpack_from("!HHI", request)
    if kind != BINDING_REQUEST or length != len(request) - 20 or length % 4:
        return None
    transaction = request[8:20]
    flags = 0
    offset = 20
    while offset + 4 <= len(request):
        attr, size = struct.unpack_from("!HH", request, offset)
        body = request[offset + 4: offset + 4 + size]
        if len(body) != size:
            return None
        if attr == CHANGE_REQUEST and size == 4:
            flags = struct.unpack("!I", body)[0] & (CHANGE_IP | CHANGE_PORT)
        offset += 4 + size + (-size % 4)
    ip, port = source
    packed_ip = socket.inet_aton(ip)
    xor_port = port ^ (MAGIC >> 16)
    xor_ip = bytes(a ^ b for a, b in zip(packed_ip, struct.pack("!I", MAGIC)))
    attrs = (struct.pack("!HHBBH", 0x0020, 8, 0, 1, xor_port) + xor_ip
             + struct.pack("!HHBBH", 0x0001, 8, 0, 1, port) + packed_ip)
    header = struct.pack("!HHI", BINDING_RESPONSE, len(attrs), cookie) + transaction
    return header + attrs, flags


def serve(ips: list[str], ports: list[int]) -> None:
    """Answer forever from the socket (ip, port) that each request's CHANGE-REQUEST names."""
    sockets: dict[tuple[int, int], socket.socket] = {}
    selector = selectors.DefaultSelector()
    for i, ip in enumerate(ips):
        for j, port in enumerate(ports):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((ip, port))
            sockets[(i, j)] = sock
            selector.register(sock, selectors.EVENT_READ, (i, j))
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            i, j = key.data
            try:
                data, source = key.fileobj.recvfrom(2048)
            except OSError:
                continue
            reply = answer(data, source)
            if reply is None:
                continue
            body, flags = reply
            out = sockets[(1 - i if flags & CHANGE_IP else i, 1 - j if flags & CHANGE_PORT else j)]
            try:
                out.sendto(body, source)
            except OSError:
                pass  # an unreachable asker: nothing to do for a test responder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ip")
    parser.add_argument("alt_ip")
    parser.add_argument("--port", type=int, default=3478)
    parser.add_argument("--alt-port", type=int, default=3479)
    args = parser.parse_args()
    serve([args.ip, args.alt_ip], [args.port, args.alt_port])
    return 0


if __name__ == "__main__":
    sys.exit(main())
