"""A minimal client for go-libp2p-daemon's control socket (p2pd v0.32), for interop tests.

The control protocol is varint-delimited protobuf over a Unix socket (go-libp2p-daemon's
pb/p2pd.proto). We need three requests, hand-encoded here: IDENTIFY, CONNECT and STREAM_OPEN
(after which the control socket carries the stream's bytes).
"""

from __future__ import annotations

import trio

from volunteer.net.streams import BufferedStream
from volunteer.net.varint import encode_uvarint

IDENTIFY, CONNECT, STREAM_OPEN = 0, 1, 2
OK = 0


def _field_varint(number: int, value: int) -> bytes:
    return encode_uvarint(number << 3) + encode_uvarint(value)


def _field_bytes(number: int, value: bytes) -> bytes:
    return encode_uvarint(number << 3 | 2) + encode_uvarint(len(value)) + value


def _parse(data: bytes) -> dict[int, list]:
    """Top-level fields of a protobuf message: number -> list of values (ints or bytes)."""
    from volunteer.net.varint import decode_uvarint_exact

    fields: dict[int, list] = {}
    pos = 0
    while pos < len(data):
        key, pos = decode_uvarint_exact(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = decode_uvarint_exact(data, pos)
        elif wire == 2:
            length, pos = decode_uvarint_exact(data, pos)
            value, pos = data[pos : pos + length], pos + length
        else:
            raise ValueError(f"unsupported wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


class ControlError(Exception):
    pass


async def _request(socket_path: str, request: bytes) -> tuple[BufferedStream, dict]:
    stream = BufferedStream(await trio.open_unix_socket(socket_path))
    await stream.send_all(encode_uvarint(len(request)) + request)
    response = _parse(await stream.receive_length_prefixed(1 << 20, "p2pd response"))
    if response.get(1, [OK])[0] != OK:
        error = _parse(response[2][0])[1][0].decode() if 2 in response else "unknown error"
        await stream.aclose()
        raise ControlError(error)
    return stream, response


async def identify(socket_path: str) -> tuple[bytes, list[bytes]]:
    """(peer ID bytes, listen multiaddrs as bytes)."""
    stream, response = await _request(socket_path, _field_varint(1, IDENTIFY))
    await stream.aclose()
    info = _parse(response[4][0])
    return info[1][0], info.get(2, [])


async def connect(socket_path: str, peer: bytes, addrs: list[bytes], timeout: int = 10) -> None:
    body = _field_bytes(1, peer) + b"".join(_field_bytes(2, a) for a in addrs) + _field_varint(3, timeout)
    stream, _ = await _request(socket_path, _field_varint(1, CONNECT) + _field_bytes(2, body))
    await stream.aclose()


async def stream_open(socket_path: str, peer: bytes, protocols: list[str], timeout: int = 10) -> tuple[BufferedStream, str]:
    """Ask p2pd to open a stream to ``peer``; returns the socket (now the stream) and the protocol."""
    body = _field_bytes(1, peer) + b"".join(_field_bytes(2, p.encode()) for p in protocols) + _field_varint(3, timeout)
    stream, response = await _request(socket_path, _field_varint(1, STREAM_OPEN) + _field_bytes(3, body))
    info = _parse(response[3][0])
    return stream, info[3][0].decode()
