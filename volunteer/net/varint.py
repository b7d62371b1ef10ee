"""Unsigned LEB128 varints as multiformats defines them (at most 9 bytes, minimal encoding)."""

from __future__ import annotations

from ..errors import RemoteProtocolError
from .limits import MAX_UVARINT_BYTES


def encode_uvarint(value: int) -> bytes:
    """Encode a non-negative integer below 2**63."""
    if value < 0 or value >= 1 << 63:
        raise ValueError(f"uvarint out of range: {value}")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_uvarint(data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int] | None:
    """Decode a varint at ``pos``. Returns ``(value, next_pos)``, or None if more bytes are needed.

    Raises RemoteProtocolError for over-long or non-minimal encodings.
    """
    value = 0
    shift = 0
    end = len(data)
    for i in range(MAX_UVARINT_BYTES):
        if pos + i >= end:
            return None
        byte = data[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and i > 0:
                raise RemoteProtocolError("non-minimal varint encoding")
            return value, pos + i + 1
        shift += 7
    raise RemoteProtocolError(f"varint longer than {MAX_UVARINT_BYTES} bytes")


def decode_uvarint_exact(data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """Like decode_uvarint, but truncated input is an error (for fully buffered messages)."""
    result = decode_uvarint(data, pos)
    if result is None:
        raise RemoteProtocolError("truncated varint")
    return result
