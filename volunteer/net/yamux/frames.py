"""yamux frame header: version, type, flags, stream id, length (12 bytes, big-endian)."""

from __future__ import annotations

import struct

from ...errors import RemoteProtocolError

HEADER = struct.Struct(">BBHII")
HEADER_SIZE = HEADER.size  # 12
VERSION = 0

DATA, WINDOW_UPDATE, PING, GO_AWAY = 0, 1, 2, 3
SYN, ACK, FIN, RST = 1, 2, 4, 8

GO_AWAY_NORMAL, GO_AWAY_PROTOCOL_ERROR, GO_AWAY_INTERNAL_ERROR = 0, 1, 2

TYPE_NAMES = {DATA: "DATA", WINDOW_UPDATE: "WINDOW_UPDATE", PING: "PING", GO_AWAY: "GO_AWAY"}


def encode_header(frame_type: int, flags: int, stream_id: int, length: int) -> bytes:
    return HEADER.pack(VERSION, frame_type, flags, stream_id, length)


def decode_header(data, offset: int = 0) -> tuple[int, int, int, int]:
    """(type, flags, stream_id, length); RemoteProtocolError for a bad version or type."""
    version, frame_type, flags, stream_id, length = HEADER.unpack_from(data, offset)
    if version != VERSION:
        raise RemoteProtocolError(f"yamux version {version} is not supported", hint="protocol error")
    if frame_type > GO_AWAY:
        raise RemoteProtocolError(f"unknown yamux frame type {frame_type}", hint="protocol error")
    return frame_type, flags, stream_id, length
