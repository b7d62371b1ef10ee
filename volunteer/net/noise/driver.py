"""trio driver for Noise: run the handshake over a stream, then encrypt and decrypt on it.

No timeouts here: the Host bounds the whole connection upgrade. Memory is bounded by the
frame size and the read chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from ...errors import HandshakeError, RemoteProtocolError
from ..identity import KeyPair, PeerID, PublicKey
from ..limits import NOISE_MAX_MESSAGE, NOISE_READ_CHUNK
from ..sendlock import SendLock
from ..streams import check_max_bytes
from .handshake import Handshake
from .transport import NoiseTransport


class NoiseConnection(trio.abc.HalfCloseableStream):
    """An authenticated, encrypted stream to ``remote_peer`` over ``raw``.

    ``send_all`` encrypts under one lock and writes once to ``raw``; ``receive_some`` returns
    decrypted bytes, b"" at a clean end of stream. A frame that fails to decrypt raises
    RemoteProtocolError and closes ``raw``; the peer vanishing mid-frame raises
    trio.BrokenResourceError.
    """

    def __init__(self, raw: trio.abc.Stream, handshake: Handshake, local_peer: PeerID, initial: bytes = b"") -> None:
        self.raw = raw
        # a completed handshake has verified the peer (handshake.transport() refuses one that has not)
        assert handshake.remote_peer is not None and handshake.remote_public_key is not None
        self.remote_peer: PeerID = handshake.remote_peer
        self.remote_public_key: PublicKey = handshake.remote_public_key
        self.remote_muxers: list[str] = list(handshake.remote_muxers)
        self.local_peer = local_peer
        self._transport: NoiseTransport = handshake.transport()
        self._initial = initial  # transport bytes that arrived with the last handshake message
        self._plain: bytes | bytearray = b""  # decrypted; bytes before _plain_pos were returned already
        self._plain_pos = 0
        self._send_lock = SendLock()
        self._receiving = False
        self._eof = False
        self._closed = False
        self._send_broken: str | None = None
        self._receive_broken: str | None = None

    # --- sending -------------------------------------------------------------------------------
    async def send_all(self, data) -> None:
        """Encrypt ``data`` (any size; empty sends nothing) and write it in one piece."""
        async with self._send_lock:
            self._check_send()
            if not len(data):
                await trio.lowlevel.checkpoint()
                return
            wire = self._transport.encrypt(data)
            try:
                await self.raw.send_all(wire)
            except BaseException as exc:
                # Part of a frame may be on the wire: nothing sent after it would decrypt.
                self._send_broken = f"an earlier send failed ({type(exc).__name__})"
                raise

    async def send_all_parts(self, parts) -> None:
        """``send_all(b"".join(parts))`` without the join (what yamux writes: headers and payloads)."""
        async with self._send_lock:
            self._check_send()
            wire = self._transport.encrypt_parts(parts)
            if not wire:
                await trio.lowlevel.checkpoint()
                return
            try:
                await self.raw.send_all(wire)
            except BaseException as exc:
                self._send_broken = f"an earlier send failed ({type(exc).__name__})"
                raise

    async def wait_send_all_might_not_block(self) -> None:
        """Pass through to the raw stream."""
        await self.raw.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        """Half-close: the peer reads b"" once it has read everything sent before."""
        async with self._send_lock:
            self._check_send()
            send_eof = getattr(self.raw, "send_eof", None)
            if send_eof is None:
                raise trio.ClosedResourceError("the stream under Noise cannot half-close")
            await send_eof()

    def _check_send(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the Noise connection is closed")
        if self._send_broken is not None:
            raise trio.BrokenResourceError(self._send_broken)

    # --- receiving -----------------------------------------------------------------------------
    @property
    def receive_cancel_safe(self) -> bool:
        """Whether a cancelled ``receive_some`` loses no bytes: a partial frame stays in the
        transport, so it holds when it holds for the raw stream (``TcpStream``)."""
        return bool(getattr(self.raw, "receive_cancel_safe", False))

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """Decrypted bytes (at most ``max_bytes``); b"" once the peer has closed cleanly.

        Like trio's own streams this may return a bytearray (a batch of frames decrypted into
        one buffer is handed over as it is, not copied again); the caller owns it.
        """
        check_max_bytes(max_bytes)
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this Noise connection")
        self._receiving = True
        try:
            return await self._receive(max_bytes)
        finally:
            self._receiving = False

    async def _receive(self, max_bytes: int | None) -> bytes | bytearray:
        if self._closed:
            raise trio.ClosedResourceError("the Noise connection is closed")
        if not self._plain:
            await self._fill()
        data, pos = self._plain, self._plain_pos
        if max_bytes is not None and len(data) - pos > max_bytes:
            # Hand out a slice and keep an offset: copying the remainder each time would be quadratic.
            self._plain_pos = pos + max_bytes
            return data[pos : pos + max_bytes]
        self._plain, self._plain_pos = b"", 0
        return data[pos:] if pos else data

    async def _fill(self) -> None:
        """Read until some plaintext is ready (frames may carry none) or the stream ends."""
        if self._receive_broken is not None:
            raise trio.BrokenResourceError(self._receive_broken)
        transport = self._transport
        while not self._plain:
            if self._eof:
                await trio.lowlevel.checkpoint()
                return
            chunk: bytes | bytearray
            if self._initial:
                await trio.lowlevel.checkpoint()  # before the bytes are taken: a cancel here loses none
                chunk, self._initial = self._initial, b""
            else:
                chunk = await self.raw.receive_some(NOISE_READ_CHUNK)
            if not chunk:
                self._eof = True
                if transport.pending:
                    self._receive_broken = "the peer closed the connection in the middle of a Noise frame"
                    raise trio.BrokenResourceError(self._receive_broken)
                return
            try:
                self._plain = transport.receive_data(chunk)
            except RemoteProtocolError as exc:
                self._receive_broken = self._send_broken = f"Noise connection failed: {exc}"
                # The peer's bytes cannot be trusted any more: this connection is over.
                await trio.aclose_forcefully(self.raw)
                raise

    # --- closing -------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the raw stream (idempotent)."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        await self.raw.aclose()

    @property
    def transport(self) -> NoiseTransport:
        """The sans-I/O cipher pair (nonce counters, for diagnostics)."""
        return self._transport


async def _run_handshake(stream: trio.abc.Stream, handshake: Handshake, local: KeyPair) -> NoiseConnection:
    try:
        while not handshake.complete:
            if handshake.our_turn:
                await stream.send_all(handshake.write_message())
                continue
            while True:
                # Small reads: a handshake message is at most 64 KiB, and what follows the
                # last one is handed to the connection anyway.
                chunk = await stream.receive_some(NOISE_MAX_MESSAGE + 2)
                if not chunk:
                    raise HandshakeError("the peer closed the connection during the Noise handshake")
                if handshake.receive_data(chunk):
                    break
    except trio.BrokenResourceError as exc:
        raise HandshakeError(f"the connection broke during the Noise handshake: {exc}") from exc
    except RemoteProtocolError as exc:  # from a stream underneath (e.g. a relayed circuit)
        raise HandshakeError(f"Noise handshake failed: {exc}") from exc
    return NoiseConnection(stream, handshake, local.peer_id, handshake.take_buffered())


async def secure_outbound(
    stream: trio.abc.Stream, identity: KeyPair, remote_peer: PeerID | None, muxers: Sequence[str] = ()
) -> NoiseConnection:
    """Run Noise as the initiator over ``stream``.

    PeerIDMismatch when ``remote_peer`` is given and someone else answers; HandshakeError for
    any other failure (including the connection breaking).
    """
    return await _run_handshake(stream, Handshake(True, identity, muxers, remote_peer), identity)


async def secure_inbound(stream: trio.abc.Stream, identity: KeyPair, muxers: Sequence[str] = ()) -> NoiseConnection:
    """Run Noise as the responder over ``stream``; HandshakeError on any failure."""
    return await _run_handshake(stream, Handshake(False, identity, muxers), identity)
