"""Byte-stream helpers shared by every protocol driver.

A ``BufferedStream`` wraps any trio stream (a TCP socket, a Noise session, a yamux stream) and lets
length-prefixed protocols read exact amounts without losing the bytes they read too far: the
leftover is handed to whoever reads next (the next protocol on the same stream).
"""

from __future__ import annotations

import operator
from typing import Protocol, cast

import trio

from ..errors import RemoteProtocolError
from .limits import READ_CHUNK
from .varint import decode_uvarint, encode_uvarint


def forwarded(name: str, attribute: str = "stream") -> property:
    """A read-only property that reads ``name`` from the wrapped stream (``self.<attribute>``)."""

    def get(self):
        return getattr(getattr(self, attribute), name)

    return property(get, doc=f"The wrapped stream's ``{name}``.")


def check_max_bytes(max_bytes: int | None) -> None:
    """trio's ``receive_some`` contract: ``max_bytes`` is None or an int >= 1 (TypeError for
    another type, ValueError for < 1), checked before anything blocks."""
    if max_bytes is None:
        return
    if operator.index(max_bytes) < 1:
        raise ValueError("max_bytes must be >= 1")


class Resettable(Protocol):
    """A stream that can be aborted in both directions (a yamux stream, or a wrapper of one)."""

    async def reset(self) -> None:
        """Abort the stream in both directions (yamux RST)."""


class BufferedStream(trio.abc.HalfCloseableStream):
    """A trio stream with a read buffer: ``receive_exactly``, ``receive_uvarint``, length-prefixed reads."""

    def __init__(self, stream: trio.abc.Stream, initial: bytes = b"") -> None:
        self.stream = stream
        self._buffer = bytearray(initial)

    # --- reading ---------------------------------------------------------------------------
    @property
    def receive_cancel_safe(self) -> bool:
        """Whether a cancelled ``receive_some`` loses no bytes: buffered bytes go out without a
        wait, so it holds when it holds for the wrapped stream."""
        return bool(getattr(self.stream, "receive_cancel_safe", False))

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """The buffered bytes first (at most ``max_bytes``), then the wrapped stream's."""
        check_max_bytes(max_bytes)
        if self._buffer:
            if max_bytes is None or max_bytes >= len(self._buffer):
                data = bytes(self._buffer)
                self._buffer.clear()
            else:
                data = bytes(self._buffer[:max_bytes])
                del self._buffer[:max_bytes]
            return data
        return await self.stream.receive_some(max_bytes)

    async def _fill(self, context: str, read_size: int = READ_CHUNK) -> None:
        chunk = await self.stream.receive_some(read_size)
        if not chunk:
            raise RemoteProtocolError(f"connection closed by peer while reading {context}")
        self._buffer += chunk

    async def receive_exactly(self, count: int, context: str = "data", *, exact: bool = False) -> bytes:
        """Read exactly ``count`` bytes; end of stream first is a RemoteProtocolError.

        ``exact``: never read past them (what follows stays in the stream, still accounted to its
        peer by the muxer); multistream negotiation reads so, before any handler owns the stream.
        """
        while len(self._buffer) < count:
            await self._fill(context, count - len(self._buffer) if exact else READ_CHUNK)
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def receive_uvarint(self, context: str = "varint", *, exact: bool = False) -> int:
        """Read one unsigned varint (``exact``: byte by byte, never past it)."""
        while True:
            decoded = decode_uvarint(self._buffer)
            if decoded is not None:
                value, used = decoded
                del self._buffer[:used]
                return value
            await self._fill(context, 1 if exact else READ_CHUNK)

    async def receive_length_prefixed(self, max_length: int, context: str = "message") -> bytes:
        """Read a uvarint length prefix and that many bytes, refusing lengths over ``max_length``."""
        length = await self.receive_uvarint(context)
        if length > max_length:
            raise RemoteProtocolError(f"{context} of {length} bytes exceeds limit {max_length}")
        return await self.receive_exactly(length, context)

    async def receive_until_eof(self, max_length: int, context: str = "message") -> bytes:
        """Read everything until the peer closes its side, refusing more than ``max_length`` bytes."""
        while True:
            if len(self._buffer) > max_length:
                raise RemoteProtocolError(f"{context} exceeds limit {max_length}")
            chunk = await self.stream.receive_some(READ_CHUNK)
            if not chunk:
                data = bytes(self._buffer)
                self._buffer.clear()
                return data
            self._buffer += chunk

    def settled(self) -> trio.abc.HalfCloseableStream | None:
        """The wrapped stream, when nothing is buffered here (reading it directly then loses
        nothing); None while bytes are buffered."""
        return None if self._buffer else cast(trio.abc.HalfCloseableStream, self.stream)

    @property
    def has_buffered_data(self) -> bool:
        """Bytes wait to be read, here or in the wrapped stream (False when the wrapped stream
        cannot tell: callers then act as if nothing had arrived)."""
        return bool(self._buffer) or bool(getattr(self.stream, "has_buffered_data", False))

    def take_buffered(self) -> bytes:
        """Remove and return whatever has been read but not consumed."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    # --- writing / closing: pass through -------------------------------------------------
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def send_all_then_eof(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` and close our side, in one write when the wrapped stream can."""
        await send_all_then_eof(self.stream, data)

    async def send_length_prefixed(self, payload: bytes) -> None:
        await self.stream.send_all(encode_uvarint(len(payload)) + payload)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        send_eof = getattr(self.stream, "send_eof", None)
        if send_eof is None:
            raise trio.ClosedResourceError("underlying stream cannot half-close")
        await send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()

    # --- the wrapped stream's extras, forwarded by name (no catch-all: a typo is an AttributeError) ---
    async def reset(self) -> None:
        """Abort the wrapped stream in both directions (yamux RST).

        Only a muxed stream can abort; wrapping a bare transport and resetting it is a bug that
        the AttributeError names.
        """
        await cast(Resettable, self.stream).reset()

    protocol = forwarded("protocol")
    connection = forwarded("connection")
    remote_peer = forwarded("remote_peer")
    stream_id = forwarded("stream_id")
    budget = forwarded("budget")


async def send_all_then_eof(stream, data: bytes | bytearray | memoryview) -> None:
    """``stream.send_all(data)`` then ``stream.send_eof()``, as one write where ``stream`` offers
    it (a yamux stream puts the reply and its FIN in one frame batch)."""
    combined = getattr(stream, "send_all_then_eof", None)
    if combined is not None:
        await combined(data)
        return
    await stream.send_all(data)
    await stream.send_eof()


async def close_quietly(stream) -> None:
    """Close ``stream``, ignoring that it may already be closed or broken."""
    try:
        await stream.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def reset_quietly(stream) -> None:
    """Reset ``stream`` (yamux RST), ignoring that it may already be gone."""
    try:
        await stream.reset()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
