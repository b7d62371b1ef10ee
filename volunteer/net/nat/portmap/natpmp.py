"""NAT-PMP (RFC 6886) messages: encode requests, decode responses. Pure and bounded.

A client asks its default gateway (UDP port 5351) for the external address (opcode 0) or for a
mapping of one internal port (opcode 1 for UDP, 2 for TCP) with a suggested external port and a
lifetime; lifetime 0 with external port 0 deletes it. Every response is a fixed size (12 bytes for
the address, 16 for a mapping) and echoes the opcode plus 128. Anything else is refused here with
``PortMappingMessageError``; a well-formed answer with a non-zero result code is a
``PortMappingError`` carrying that code.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from ....errors import PortMappingError, PortMappingMessageError
from ... import limits

VERSION = 0
OP_EXTERNAL_ADDRESS = 0
OP_MAP = {"udp": 1, "tcp": 2}
RESPONSE_BIT = 128
RESULT_UNSUPPORTED_VERSION = 1
RESULTS = {
    0: "success",
    1: "unsupported version",
    2: "not authorized or refused",
    3: "network failure",
    4: "out of resources",
    5: "unsupported opcode",
}
ADDRESS_RESPONSE_SIZE = 12
MAP_RESPONSE_SIZE = 16


@dataclass(frozen=True)
class ExternalAddress:
    """The gateway's external IPv4 address and its epoch (seconds since its mappings were reset)."""

    ip: str
    epoch: int


@dataclass(frozen=True)
class Mapped:
    """A mapping the gateway granted (or, with lifetime 0, deleted)."""

    transport: str  # "tcp" or "udp"
    internal_port: int
    external_port: int
    lifetime: int  # seconds
    epoch: int


def external_address_request() -> bytes:
    """Ask for the external address (two bytes: version, opcode)."""
    return bytes((VERSION, OP_EXTERNAL_ADDRESS))


def map_request(transport: str, internal_port: int, external_port: int, lifetime: int) -> bytes:
    """Ask to map ``internal_port`` (``external_port`` suggested, 0 for any) for ``lifetime``
    seconds; lifetime 0 and external port 0 delete the mapping."""
    if transport not in OP_MAP:
        raise ValueError(f"NAT-PMP maps tcp or udp, not {transport!r}")
    if not (0 < internal_port < 65536 and 0 <= external_port < 65536 and 0 <= lifetime <= limits.PORTMAP_MAX_LIFETIME):
        raise ValueError("NAT-PMP: port or lifetime out of range")
    return struct.pack("!BBHHHI", VERSION, OP_MAP[transport], 0, internal_port, external_port, lifetime)


def _header(data: bytes, opcode: int) -> tuple[int, int]:
    """(result code, epoch) of a response to ``opcode``; PortMappingMessageError if it is not one."""
    if len(data) < 8 or len(data) > limits.PORTMAP_MAX_MESSAGE:
        raise PortMappingMessageError(f"NAT-PMP response of {len(data)} bytes")
    version, op, result, epoch = struct.unpack_from("!BBHI", data)
    if version != VERSION:
        raise PortMappingMessageError(f"NAT-PMP response of version {version}")
    if op != RESPONSE_BIT + opcode:
        raise PortMappingMessageError(f"NAT-PMP response opcode {op}, expected {RESPONSE_BIT + opcode}")
    return result, epoch


def _check(result: int) -> None:
    if result != 0:
        raise PortMappingError(f"NAT-PMP: {RESULTS.get(result, f'result code {result}')}", code=result)


def decode_external_address(data: bytes) -> ExternalAddress:
    """The answer to ``external_address_request``."""
    result, epoch = _header(data, OP_EXTERNAL_ADDRESS)
    _check(result)
    if len(data) != ADDRESS_RESPONSE_SIZE:
        raise PortMappingMessageError(f"NAT-PMP address response of {len(data)} bytes")
    return ExternalAddress(str(ipaddress.IPv4Address(data[8:12])), epoch)


def decode_map(data: bytes, transport: str) -> Mapped:
    """The answer to ``map_request`` for ``transport``."""
    result, epoch = _header(data, OP_MAP[transport])
    _check(result)
    if len(data) != MAP_RESPONSE_SIZE:
        raise PortMappingMessageError(f"NAT-PMP mapping response of {len(data)} bytes")
    internal, external, lifetime = struct.unpack_from("!HHI", data, 8)
    if internal == 0 or (lifetime and external == 0):
        raise PortMappingMessageError("NAT-PMP mapping response without a port")
    return Mapped(transport, internal, external, min(lifetime, limits.PORTMAP_MAX_LIFETIME), epoch)


def is_version_refusal(data: bytes) -> bool:
    """Whether ``data`` is a NAT-PMP 'unsupported version' answer: what a NAT-PMP-only gateway
    sends back to a PCP request (RFC 6887, section 9)."""
    if len(data) < 4 or data[0] != VERSION or not data[1] & RESPONSE_BIT:
        return False
    return struct.unpack_from("!H", data, 2)[0] == RESULT_UNSUPPORTED_VERSION


__all__ = [
    "ExternalAddress",
    "Mapped",
    "decode_external_address",
    "decode_map",
    "external_address_request",
    "is_version_refusal",
    "map_request",
]
