"""The one place that parses a protobuf message off the wire: bad bytes become RemoteProtocolError."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from ...errors import RemoteProtocolError

M = TypeVar("M", bound=Message)


def parse(kind: type[M], data: bytes | bytearray | memoryview, what: str) -> M:
    """``kind`` parsed from ``data``; a malformed message raises ``RemoteProtocolError`` naming ``what``."""
    message = kind()
    try:
        message.ParseFromString(bytes(data))
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise RemoteProtocolError(f"malformed {what}: {exc}") from None
    return message


__all__ = ["parse"]
