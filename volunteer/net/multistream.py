"""multistream-select 1.0 (`/multistream/1.0.0`): agree on a protocol for a connection or stream.

Messages are a uvarint length, UTF-8 text and a trailing newline. The dialer proposes protocols
one by one; the listener echoes a protocol it speaks or answers ``na``. ``lazy_outbound`` is the
0-RTT form: header, protocol and the first data leave in one write, and the echo is checked on
the first read.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import trio

from ..errors import HandshakeError, NegotiationError, RemoteProtocolError
from .limits import MAX_MULTISTREAM_MESSAGE, MAX_MULTISTREAM_ROUNDS
from .streams import BufferedStream, check_max_bytes, forwarded
from .varint import decode_uvarint, encode_uvarint

PROTOCOL_ID = "/multistream/1.0.0"
NA = "na"
LS = "ls"


def encode_message(text: str) -> bytes:
    """One multistream message: uvarint(len) + text + '\\n'."""
    body = text.encode("utf-8") + b"\n"
    if len(body) > MAX_MULTISTREAM_MESSAGE:
        raise ValueError(f"multistream message longer than {MAX_MULTISTREAM_MESSAGE} bytes")
    return encode_uvarint(len(body)) + body


def decode_message(buffer: bytes | bytearray) -> tuple[str, int] | None:
    """Decode one message at the start of ``buffer``: (text, bytes used), or None if incomplete."""
    decoded = decode_uvarint(buffer)
    if decoded is None:
        return None
    length, start = decoded
    if length > MAX_MULTISTREAM_MESSAGE:
        raise RemoteProtocolError(f"multistream message of {length} bytes exceeds {MAX_MULTISTREAM_MESSAGE}")
    if len(buffer) < start + length:
        return None
    body = bytes(buffer[start : start + length])
    if not body.endswith(b"\n"):
        raise RemoteProtocolError("multistream message does not end with a newline")
    try:
        return body[:-1].decode("utf-8"), start + length
    except UnicodeDecodeError:
        raise RemoteProtocolError("multistream message is not UTF-8") from None


async def read_message(stream: BufferedStream, *, exact: bool = False) -> str:
    """Read one message; the peer closing first is a RemoteProtocolError.

    ``exact``: read no byte past the message, so what a peer sends after it (0-RTT data) stays in
    the muxer, accounted to that peer, until a handler reads it (inbound yamux streams).
    """
    length = await stream.receive_uvarint("multistream message", exact=exact)
    if length > MAX_MULTISTREAM_MESSAGE:
        raise RemoteProtocolError(f"multistream message of {length} bytes exceeds {MAX_MULTISTREAM_MESSAGE}")
    body = await stream.receive_exactly(length, "multistream message", exact=exact)
    decoded = decode_message(encode_uvarint(length) + body)
    assert decoded is not None  # the whole message is in hand, so it cannot be incomplete
    return decoded[0]


async def _expect_header(stream: BufferedStream, *, exact: bool = False) -> None:
    header = await read_message(stream, exact=exact)
    if header != PROTOCOL_ID:
        raise RemoteProtocolError(f"expected {PROTOCOL_ID}, got {header[:64]!r}")


async def select_outbound(stream: BufferedStream, protocols: Sequence[str]) -> str:
    """Dialer: propose each protocol in turn until the listener echoes one."""
    if not protocols:
        raise ValueError("no protocols to propose")
    # Header and first proposal in one write (what go-libp2p does too).
    await stream.send_all(encode_message(PROTOCOL_ID) + encode_message(protocols[0]))
    await _expect_header(stream)
    for index, protocol in enumerate(protocols[:MAX_MULTISTREAM_ROUNDS]):
        if index:
            await stream.send_all(encode_message(protocol))
        answer = await read_message(stream)
        if answer == protocol:
            return protocol
        if answer != NA:
            raise RemoteProtocolError(f"unexpected multistream answer {answer[:64]!r} to {protocol!r}")
    raise NegotiationError(f"peer supports none of {list(protocols)}")


async def select_inbound(
    stream: BufferedStream,
    supported: Callable[[str], bool] | Collection[str],
    *,
    header_timeout: float | None = None,
    exact: bool = False,
) -> str:
    """Listener: answer the header, then echo the first proposal we support (``na`` to others).

    ``header_timeout``: seconds the dialer has to send the header (HandshakeError after them):
    an honest dialer sends it in its first packet, a slowloris never does. ``exact``: read no
    byte past the negotiation (see ``read_message``).
    """
    accepts = supported if callable(supported) else supported.__contains__
    if header_timeout is None:
        await _expect_header(stream, exact=exact)
    else:
        with trio.move_on_after(header_timeout) as waited:
            await _expect_header(stream, exact=exact)
        if waited.cancelled_caught:
            raise HandshakeError(f"no multistream header within {header_timeout}s")
    # Our header may wait to leave with the first answer (one write less) only when the dialer's
    # proposal has begun to arrive: a dialer that waits for our header before proposing (as
    # py-libp2p's does) would otherwise wait for us while we wait for it.
    pending = encode_message(PROTOCOL_ID)
    if not stream.has_buffered_data:
        await stream.send_all(pending)
        pending = b""
    for _ in range(MAX_MULTISTREAM_ROUNDS):
        proposal = await read_message(stream, exact=exact)
        if proposal != LS and accepts(proposal):
            await stream.send_all(pending + encode_message(proposal))
            return proposal
        await stream.send_all(pending + encode_message(NA))
        pending = b""
    raise RemoteProtocolError(f"peer proposed more than {MAX_MULTISTREAM_ROUNDS} protocols")


class LazyStream(trio.abc.HalfCloseableStream):
    """A stream whose protocol negotiation rides along with its first write (0-RTT).

    The first write carries header + protocol + data; the first read checks the listener's echo
    (NegotiationError on ``na``). After that, calls go straight to the wrapped stream.
    """

    def __init__(self, stream: BufferedStream, protocol: str) -> None:
        self._stream = stream
        self.protocol = protocol
        self._pending_request: bytes | None = encode_message(PROTOCOL_ID) + encode_message(protocol)
        self._confirmed = False
        self._confirm_lock = trio.Lock()

    async def _flush_request(self, data: bytes | bytearray | memoryview = b"") -> None:
        request, self._pending_request = self._pending_request, None
        assert request is not None  # callers flush only while a request is pending
        await self._stream.send_all(request + bytes(data) if len(data) < 65536 else request)
        if len(data) >= 65536:
            await self._stream.send_all(data)

    async def _confirm(self) -> None:
        async with self._confirm_lock:
            if self._confirmed:
                return
            if self._pending_request is not None:
                await self._flush_request()
            await _expect_header(self._stream)
            answer = await read_message(self._stream)
            if answer == NA:
                raise NegotiationError(f"peer does not support {self.protocol}")
            if answer != self.protocol:
                raise RemoteProtocolError(f"unexpected multistream answer {answer[:64]!r} to {self.protocol!r}")
            self._confirmed = True

    def settled(self) -> trio.abc.HalfCloseableStream | None:
        """The stream under the negotiation once it is over (confirmed, nothing pending or
        buffered): calls to this one would only pass through to it. None before."""
        if not self._confirmed or self._pending_request is not None:
            return None
        return self._stream.settled()

    async def send_all(self, data) -> None:
        if self._pending_request is not None:
            await self._flush_request(data)
        else:
            await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """The wrapped stream's bytes, after checking the listener's echo of the protocol."""
        check_max_bytes(max_bytes)
        if not self._confirmed:
            await self._confirm()
        return await self._stream.receive_some(max_bytes)

    async def send_eof(self) -> None:
        if self._pending_request is not None:
            await self._flush_request()
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()

    # --- the wrapped stream's extras, forwarded by name (no catch-all) ---
    async def reset(self) -> None:
        """Abort the stream in both directions (yamux RST), negotiated or not."""
        self._pending_request = None
        await self._stream.reset()

    connection = forwarded("connection", "_stream")
    remote_peer = forwarded("remote_peer", "_stream")
    stream_id = forwarded("stream_id", "_stream")
    budget = forwarded("budget", "_stream")


def lazy_outbound(stream: BufferedStream, protocol: str) -> LazyStream:
    """Negotiate ``protocol`` lazily on ``stream`` (see LazyStream)."""
    return LazyStream(stream, protocol)
