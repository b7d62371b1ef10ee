"""Multiaddr: self-describing network addresses, text (``/ip4/1.2.3.4/tcp/4001``) and binary forms.

A small module of our own (the `multiaddr` package pulls in four more dependencies for what is a
table and two codecs). Binary form: each component is a uvarint protocol code followed by its
value: fixed-size for ip4/ip6/ports, uvarint-length-prefixed for names, paths and peer IDs.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

import base58

from ..errors import MultiaddrError, PeerIDError, RemoteProtocolError
from .limits import MAX_MULTIADDR_BYTES
from .varint import decode_uvarint, encode_uvarint

if TYPE_CHECKING:
    from .identity import PeerID

VARIABLE = -1  # value is uvarint-length-prefixed


@dataclass(frozen=True)
class Protocol:
    code: int
    name: str
    size: int  # bytes of the value; 0 = no value; VARIABLE = length-prefixed


PROTOCOLS = [
    Protocol(4, "ip4", 4),
    Protocol(6, "tcp", 2),
    Protocol(273, "udp", 2),
    Protocol(33, "dccp", 2),
    Protocol(132, "sctp", 2),
    Protocol(41, "ip6", 16),
    Protocol(42, "ip6zone", VARIABLE),
    Protocol(53, "dns", VARIABLE),
    Protocol(54, "dns4", VARIABLE),
    Protocol(55, "dns6", VARIABLE),
    Protocol(56, "dnsaddr", VARIABLE),
    Protocol(421, "p2p", VARIABLE),
    Protocol(290, "p2p-circuit", 0),
    Protocol(460, "quic", 0),
    Protocol(461, "quic-v1", 0),
    Protocol(465, "webtransport", 0),
    Protocol(466, "certhash", VARIABLE),
    Protocol(477, "ws", 0),
    Protocol(478, "wss", 0),
    Protocol(448, "tls", 0),
    Protocol(449, "sni", VARIABLE),
    Protocol(454, "noise", 0),
    Protocol(480, "http", 0),
    Protocol(443, "https", 0),
    Protocol(280, "webrtc-direct", 0),
    Protocol(281, "webrtc", 0),
    Protocol(400, "unix", VARIABLE),
    Protocol(777, "memory", 8),
]
BY_NAME = {p.name: p for p in PROTOCOLS}
BY_NAME["ipfs"] = BY_NAME["p2p"]  # legacy alias, printed as p2p
BY_CODE = {p.code: p for p in PROTOCOLS}


def _value_to_bytes(proto: Protocol, text: str, whole: str) -> bytes:
    try:
        if proto.name == "ip4":
            return ipaddress.IPv4Address(text).packed
        if proto.name == "ip6":
            return ipaddress.IPv6Address(text).packed
        if proto.size == 2:
            port = int(text, 10)
            if not 0 <= port <= 65535 or not text.isdigit():
                raise ValueError("port out of range")
            return port.to_bytes(2, "big")
        if proto.name == "memory":
            number = int(text, 10)
            if not text.isdigit() or number >= 1 << 64:
                raise ValueError("memory address out of range")
            return number.to_bytes(8, "big")
        if proto.name == "p2p":
            from .identity import PeerID

            raw = PeerID.from_string(text).to_bytes()
        else:
            raw = text.encode("utf-8")
        if not raw:
            raise ValueError("empty value")
        return encode_uvarint(len(raw)) + raw
    except (ValueError, PeerIDError) as exc:
        raise MultiaddrError(f"{whole}: invalid {proto.name} value {text!r} ({exc})") from None


def _value_to_text(proto: Protocol, value: bytes) -> str:
    if proto.name == "ip4":
        return str(ipaddress.IPv4Address(value))
    if proto.name == "ip6":
        return str(ipaddress.IPv6Address(value))
    if proto.size in (2, 8):
        return str(int.from_bytes(value, "big"))
    if proto.name == "p2p":
        return base58.b58encode(value).decode()
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise MultiaddrError(f"/{proto.name} value is not UTF-8") from None


class Multiaddr:
    """An immutable multiaddr; equality and hashing by the binary form."""

    __slots__ = ("_bytes", "_components")
    _bytes: bytes
    _components: tuple[tuple[str, str | None], ...]  # (protocol name, value as text or None)

    def __init__(self, addr: "str | bytes | Multiaddr") -> None:
        if isinstance(addr, Multiaddr):
            self._bytes, self._components = addr._bytes, addr._components
        elif isinstance(addr, str):
            self._bytes, self._components = _parse_text(addr)
        elif isinstance(addr, (bytes, bytearray, memoryview)):
            self._bytes, self._components = _parse_bytes(bytes(addr))
        else:
            raise MultiaddrError(f"cannot make a multiaddr from {type(addr).__name__}")

    @classmethod
    def from_bytes(cls, data: bytes) -> "Multiaddr":
        return cls(bytes(data))

    @classmethod
    def _from_components(cls, components: tuple[tuple[str, str | None], ...]) -> "Multiaddr":
        return cls(_format(components) or "/")

    def to_bytes(self) -> bytes:
        return self._bytes

    @property
    def components(self) -> tuple[tuple[str, str | None], ...]:
        return self._components

    def protocols(self) -> list[str]:
        return [name for name, _ in self._components]

    def value_at(self, index: int) -> str:
        """The value of component ``index`` (/ip4's address, /tcp's port...).

        MultiaddrError for a protocol that carries no value (/p2p-circuit): callers ask this of
        components whose protocol they have checked, so that is a bug, said plainly.
        """
        name, value = self._components[index]
        if value is None:
            raise MultiaddrError(f"/{name} carries no value")
        return value

    def value_for(self, name: str) -> str | None:
        for proto, value in self._components:
            if proto == name:
                return value
        return None

    def encapsulate(self, other: "Multiaddr | str") -> "Multiaddr":
        return Multiaddr(self._bytes + Multiaddr(other)._bytes)

    def decapsulate(self, other: "Multiaddr | str") -> "Multiaddr":
        """Cut at the last occurrence of ``other`` (its whole text) and drop everything after."""
        needle = str(Multiaddr(other))
        text = str(self)
        index = text.rfind(needle)
        if index < 0:
            return self
        return Multiaddr(text[:index]) if index else Multiaddr._from_components(())

    def decapsulate_code(self, name: str) -> "Multiaddr":
        """Drop the last ``/name`` component and everything after it."""
        for index in range(len(self._components) - 1, -1, -1):
            if self._components[index][0] == name:
                return Multiaddr._from_components(self._components[:index])
        return self

    @property
    def peer_id(self) -> "PeerID | None":
        """The last /p2p component's peer ID."""
        from .identity import PeerID

        for name, value in reversed(self._components):
            if name == "p2p" and value is not None:  # the parser gives every /p2p a value
                return PeerID.from_string(value)
        return None

    def with_peer_id(self, peer: "PeerID") -> "Multiaddr":
        if self._components and self._components[-1] == ("p2p", str(peer)):
            return self
        return self.encapsulate(f"/p2p/{peer}")

    def without_peer_id(self) -> "Multiaddr":
        if self._components and self._components[-1][0] == "p2p":
            return Multiaddr._from_components(self._components[:-1])
        return self

    def is_relayed(self) -> bool:
        return any(name == "p2p-circuit" for name, _ in self._components)

    def relay_parts(self) -> "tuple[Multiaddr, PeerID | None] | None":
        """For ``R_ADDR/p2p/R/p2p-circuit/p2p/T``: (``R_ADDR/p2p/R``, T). None if not relayed."""
        from .identity import PeerID

        for index in range(len(self._components) - 1, -1, -1):
            if self._components[index][0] == "p2p-circuit":
                relay = Multiaddr._from_components(self._components[:index])
                rest = self._components[index + 1 :]
                target = PeerID.from_string(rest[0][1]) if rest and rest[0][0] == "p2p" and rest[0][1] else None
                return relay, target
        return None

    def __str__(self) -> str:
        return _format(self._components) or "/"

    def __repr__(self) -> str:
        return f"Multiaddr({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Multiaddr) and self._bytes == other._bytes

    def __hash__(self) -> int:
        return hash(self._bytes)

    def __bool__(self) -> bool:
        return bool(self._bytes)


def _format(components: tuple[tuple[str, str | None], ...]) -> str:
    parts = []
    for name, value in components:
        parts.append(f"/{name}")
        if value is not None:
            parts.append(value if value.startswith("/") else f"/{value}")  # unix paths carry their own /
    return "".join(parts)


def _parse_text(text: str) -> tuple[bytes, tuple[tuple[str, str | None], ...]]:
    if len(text) > 4 * MAX_MULTIADDR_BYTES:
        raise MultiaddrError("multiaddr text too long")
    if not text.startswith("/"):
        raise MultiaddrError(f"{text!r}: a multiaddr starts with '/'")
    parts = text.rstrip("/").split("/")[1:] if text != "/" else []
    out = bytearray()
    i = 0
    while i < len(parts):
        name = parts[i]
        proto = BY_NAME.get(name)
        if proto is None:
            raise MultiaddrError(f"{text}: unknown protocol {name!r}")
        i += 1
        if proto.size == 0:
            out += encode_uvarint(proto.code)
            continue
        if proto.name == "unix":  # a path: takes the rest of the address
            value = "/" + "/".join(parts[i:]) if i < len(parts) else ""
            i = len(parts)
        elif i < len(parts):
            value = parts[i]
            i += 1
        else:
            raise MultiaddrError(f"{text}: /{name} needs a value")
        out += encode_uvarint(proto.code) + _value_to_bytes(proto, value, text)
    data = bytes(out)
    if len(data) > MAX_MULTIADDR_BYTES:
        raise MultiaddrError(f"multiaddr of {len(data)} bytes exceeds {MAX_MULTIADDR_BYTES}")
    # The text form is normalised through the binary one (ip6 compression, the ipfs alias).
    return _parse_bytes(data)


def _parse_bytes(data: bytes) -> tuple[bytes, tuple[tuple[str, str | None], ...]]:
    if len(data) > MAX_MULTIADDR_BYTES:
        raise MultiaddrError(f"multiaddr of {len(data)} bytes exceeds {MAX_MULTIADDR_BYTES}")
    components: list[tuple[str, str | None]] = []
    pos = 0
    try:
        while pos < len(data):
            decoded = decode_uvarint(data, pos)
            if decoded is None:
                raise MultiaddrError("truncated protocol code")
            code, pos = decoded
            proto = BY_CODE.get(code)
            if proto is None:
                raise MultiaddrError(f"unknown protocol code {code}")
            if proto.size == 0:
                components.append((proto.name, None))
                continue
            if proto.size == VARIABLE:
                decoded = decode_uvarint(data, pos)
                if decoded is None:
                    raise MultiaddrError(f"truncated /{proto.name} length")
                length, pos = decoded
            else:
                length = proto.size
            if length == 0 or pos + length > len(data):
                raise MultiaddrError(f"truncated or empty /{proto.name} value")
            value = data[pos : pos + length]
            pos += length
            if proto.name == "p2p":
                from .identity import PeerID

                try:
                    PeerID.from_bytes(value)
                except PeerIDError as exc:
                    raise MultiaddrError(f"invalid /p2p value: {exc}") from None
            components.append((proto.name, _value_to_text(proto, value)))
    except RemoteProtocolError as exc:
        raise MultiaddrError(f"malformed multiaddr: {exc}") from None
    return data, tuple(components)
