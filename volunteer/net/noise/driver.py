"""trio driver for Noise: run the handshake over a stream, then encrypt and decrypt on it."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from ...errors import HandshakeError, RemoteProtocolError
from ..identity import KeyPair, PeerID, PublicKey
from ..limits import READ_CHUNK
from ..streams import BufferedStream
from .handshake import Handshake
from .transport import NoiseTransport


class NoiseConnection(trio.abc.HalfCloseableStream):
    """An authenticated, encrypted stream to ``remote_peer``."""

    def __init__(self, raw: trio.abc.Stream, handshake: Handshake, local_peer: PeerID, initial: bytes = b"") -> None:
        self.raw = raw
        self.remote_peer: PeerID = handshake.remote_peer
        self.remote_public_key: PublicKey = handshake.remote_public_key
        self.remote_muxers: list[str] = handshake.remote_muxers
        self.local_peer = local_peer
        send, receive = handshake.split()
        self._transport = NoiseTransport(send, receive)
        self._plaintext = b""
        self._initial = initial
        self._send_lock = trio.StrictFIFOLock()
        self._eof = False

    async def send_all(self, data) -> None:
        async with self._send_lock:
            if len(data):
                await self.raw.send_all(self._transport.encrypt(data))

    async def wait_send_all_might_not_block(self) -> None:
        await self.raw.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._plaintext:
            if self._eof:
                return b""
            if self._initial:
                chunk, self._initial = self._initial, b""
            else:
                chunk = await self.raw.receive_some(READ_CHUNK)
            if not chunk:
                self._eof = True
                if self._transport.pending:
                    raise trio.BrokenResourceError("peer closed the connection in the middle of a Noise frame")
                return b""
            self._plaintext = self._transport.receive_data(chunk)
        data = self._plaintext
        if max_bytes is not None and len(data) > max_bytes:
            self._plaintext = data[max_bytes:]
            return data[:max_bytes]
        self._plaintext = b""
        return data

    async def send_eof(self) -> None:
        send_eof = getattr(self.raw, "send_eof", None)
        if send_eof is None:
            raise trio.ClosedResourceError("the underlying stream cannot half-close")
        async with self._send_lock:
            await send_eof()

    async def aclose(self) -> None:
        await self.raw.aclose()


async def _read_frame(stream: BufferedStream) -> bytes:
    length = int.from_bytes(await stream.receive_exactly(2, "Noise handshake"), "big")
    return await stream.receive_exactly(length, "Noise handshake")


async def _run_handshake(stream: trio.abc.Stream, handshake: Handshake, local: KeyPair) -> NoiseConnection:
    buffered = stream if isinstance(stream, BufferedStream) else BufferedStream(stream)
    try:
        if handshake.initiator:
            await buffered.send_all(handshake.write_message())
            handshake.read_message(await _read_frame(buffered))
            await buffered.send_all(handshake.write_message())
        else:
            handshake.read_message(await _read_frame(buffered))
            await buffered.send_all(handshake.write_message())
            handshake.read_message(await _read_frame(buffered))
    except RemoteProtocolError as exc:
        raise HandshakeError(f"Noise handshake failed: {exc}") from None
    except trio.BrokenResourceError as exc:
        raise HandshakeError(f"connection broke during the Noise handshake: {exc}") from None
    # Bytes the peer sent right after its last handshake message belong to the transport phase.
    return NoiseConnection(buffered.stream, handshake, local.peer_id, buffered.take_buffered())


async def secure_outbound(
    stream: trio.abc.Stream, identity: KeyPair, remote_peer: PeerID | None, muxers: Sequence[str] = ()
) -> NoiseConnection:
    """Run Noise as the initiator; PeerIDMismatch if the peer is not ``remote_peer``."""
    return await _run_handshake(stream, Handshake(True, identity, muxers, remote_peer), identity)


async def secure_inbound(stream: trio.abc.Stream, identity: KeyPair, muxers: Sequence[str] = ()) -> NoiseConnection:
    """Run Noise as the responder."""
    return await _run_handshake(stream, Handshake(False, identity, muxers), identity)
