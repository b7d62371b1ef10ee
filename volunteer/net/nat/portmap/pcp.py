"""PCP (RFC 6887) MAP messages: encode requests, decode responses. Pure and bounded.

A PCP request is a 24-byte header (version 2, opcode, requested lifetime, the client's own IP as
16 bytes, IPv4 written as ::ffff:a.b.c.d) followed by the opcode's payload; MAP's is a 12-byte
nonce, the protocol, the internal port, a suggested external port and address. A response repeats
the opcode with the R bit set and brings a result code, the granted lifetime, the server's epoch
and the assigned external port and address, with the same nonce (answers to other requests are
not ours). Options may follow; they are skipped within the 1100-byte bound, never interpreted.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from ....errors import PortMappingError, PortMappingMessageError
from ... import limits

VERSION = 2
OP_MAP = 1
RESPONSE_BIT = 0x80
PROTOCOLS = {"tcp": 6, "udp": 17}
NONCE_SIZE = 12
HEADER_SIZE = 24
MAP_SIZE = 36
RESULTS = {
    0: "success",
    1: "unsupported version",
    2: "not authorized",
    3: "malformed request",
    4: "unsupported opcode",
    5: "unsupported option",
    6: "malformed option",
    7: "network failure",
    8: "no resources",
    9: "unsupported protocol",
    10: "user exceeded quota",
    11: "cannot provide external",
    12: "address mismatch",
    13: "excessive remote peers",
}


@dataclass(frozen=True)
class Mapped:
    """A mapping the PCP server granted (or, with lifetime 0, deleted)."""

    transport: str
    internal_port: int
    external_port: int
    external_ip: str
    lifetime: int
    epoch: int


def _ip16(ip: str) -> bytes:
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv4Address):
        return ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed).packed
    return address.packed


def _ip_text(raw: bytes) -> str:
    address = ipaddress.IPv6Address(raw)
    return str(address.ipv4_mapped) if address.ipv4_mapped is not None else str(address)


def map_request(nonce: bytes, client_ip: str, transport: str, internal_port: int, external_port: int,
                lifetime: int, external_ip: str | None = None) -> bytes:
    """A MAP request from ``client_ip`` (our address toward the gateway) for ``internal_port``;
    lifetime 0 deletes the mapping that carries the same nonce."""
    if len(nonce) != NONCE_SIZE:
        raise ValueError("a PCP nonce is 12 bytes")
    if transport not in PROTOCOLS:
        raise ValueError(f"PCP maps tcp or udp here, not {transport!r}")
    if not (0 < internal_port < 65536 and 0 <= external_port < 65536 and 0 <= lifetime <= limits.PORTMAP_MAX_LIFETIME):
        raise ValueError("PCP: port or lifetime out of range")
    suggested = _ip16(external_ip) if external_ip else _ip16("0.0.0.0")
    header = struct.pack("!BBHI", VERSION, OP_MAP, 0, lifetime) + _ip16(client_ip)
    payload = nonce + struct.pack("!B3xHH", PROTOCOLS[transport], internal_port, external_port) + suggested
    return header + payload


def decode_map(data: bytes, nonce: bytes, transport: str) -> Mapped:
    """The answer to a MAP request with ``nonce`` for ``transport``.

    PortMappingMessageError for anything that is not such an answer (a NAT-PMP-only gateway's
    'unsupported version' included: tell it apart with ``natpmp.is_version_refusal`` first);
    PortMappingError with the result code when the server refused."""
    if len(data) < HEADER_SIZE or len(data) > limits.PORTMAP_MAX_MESSAGE or len(data) % 4:
        raise PortMappingMessageError(f"PCP response of {len(data)} bytes")
    version, op, _, result, lifetime, epoch = struct.unpack_from("!BBBBII", data)
    if version != VERSION:
        raise PortMappingMessageError(f"PCP response of version {version}")
    if op != RESPONSE_BIT | OP_MAP:
        raise PortMappingMessageError(f"PCP response opcode {op:#x}, expected {RESPONSE_BIT | OP_MAP:#x}")
    if result != 0:
        # error responses may be just the header; the server's verdict is what matters
        raise PortMappingError(f"PCP: {RESULTS.get(result, f'result code {result}')}", code=result)
    if len(data) < HEADER_SIZE + MAP_SIZE:
        raise PortMappingMessageError("PCP MAP response without its payload")
    body = data[HEADER_SIZE:HEADER_SIZE + MAP_SIZE]
    if body[:NONCE_SIZE] != nonce:
        raise PortMappingMessageError("PCP MAP response for another request (nonce)")
    protocol, internal, external = struct.unpack_from("!B3xHH", body, NONCE_SIZE)
    if protocol != PROTOCOLS[transport]:
        raise PortMappingMessageError(f"PCP MAP response for protocol {protocol}")
    if internal == 0 or (lifetime and external == 0):
        raise PortMappingMessageError("PCP MAP response without a port")
    return Mapped(transport, internal, external, _ip_text(body[NONCE_SIZE + 8:]),
                  min(lifetime, limits.PORTMAP_MAX_LIFETIME), epoch)


__all__ = ["Mapped", "decode_map", "map_request"]
