"""Noise transport phase (sans-I/O): plaintext in, 2-byte-framed ciphertext out, and back.

This is the hot path of the whole stack, so it works on whole buffers: one output buffer per
call, ``encrypt_into``/``decrypt_into`` straight into it, memoryview slices instead of copies,
and a read offset instead of deleting consumed bytes. Only a frame split across two reads is
copied (at most 65537 bytes).
"""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from ...errors import LocalProtocolError, RemoteProtocolError
from ..limits import NOISE_MAX_NONCE, NOISE_MAX_PLAINTEXT, NOISE_TAG_LEN

# ChaChaPoly nonce in Noise: 4 zero bytes, then the 64-bit counter little-endian.
nonce_bytes = struct.Struct("<4xQ").pack

_FRAME_OVERHEAD = 2 + NOISE_TAG_LEN


def _byte_view(data) -> memoryview:
    view = memoryview(data)
    if view.itemsize != 1 or view.ndim != 1:
        view = view.cast("B")
    return view


class CipherState:
    """The Noise CipherState: a key and a nonce counter that never repeats.

    Nonces ``0 .. max_nonce - 1`` may be used; asking for more raises LocalProtocolError
    before any nonce is reused (the connection has to be re-established). Without a key
    (early in the handshake) encryption is the identity, as the Noise spec says.
    """

    __slots__ = ("aead", "n", "max_nonce")

    def __init__(self, key: bytes | None, max_nonce: int = NOISE_MAX_NONCE) -> None:
        self.aead = ChaCha20Poly1305(key) if key is not None else None
        self.n = 0
        self.max_nonce = max_nonce

    @property
    def has_key(self) -> bool:
        """Whether a key is set (before the first MixKey it is not)."""
        return self.aead is not None

    def _next_nonce(self) -> bytes:
        if self.n >= self.max_nonce:
            raise LocalProtocolError("Noise nonce space exhausted; the connection must be re-established")
        nonce = nonce_bytes(self.n)
        self.n += 1
        return nonce

    def encrypt(self, ad: bytes | None, plaintext) -> bytes:
        """EncryptWithAd: ciphertext with its 16-byte tag (plaintext itself when there is no key)."""
        if self.aead is None:
            return bytes(plaintext)
        return self.aead.encrypt(self._next_nonce(), plaintext, ad)

    def decrypt(self, ad: bytes | None, ciphertext) -> bytes:
        """DecryptWithAd; a bad tag raises RemoteProtocolError (the nonce is used up either way)."""
        if self.aead is None:
            return bytes(ciphertext)
        nonce = self._next_nonce()
        try:
            return self.aead.decrypt(nonce, ciphertext, ad)
        except InvalidTag:
            raise RemoteProtocolError("Noise message failed authentication") from None


class NoiseTransport:
    """Encrypts outgoing data into frames and decrypts incoming frames, keeping a partial one.

    ``send`` and ``receive`` are the two CipherStates from the handshake's split. After a frame
    fails to decrypt, every later ``receive_data`` raises again: the stream is unusable.
    """

    def __init__(self, send: CipherState, receive: CipherState) -> None:
        if send.aead is None or receive.aead is None:
            raise LocalProtocolError("the transport phase needs keyed cipher states")
        self._send = send
        self._receive = receive
        self._partial = bytearray()  # an incomplete frame (length prefix included), < 65537 bytes
        self._error: str | None = None

    # --- sending -----------------------------------------------------------------------------
    def encrypt(self, data) -> bytearray:
        """Frames of at most 65519 plaintext bytes each, concatenated into one buffer.

        Returns a fresh bytearray (a bytes-like object, ready for ``send_all``); empty input
        gives an empty buffer and uses no nonce.
        """
        view = _byte_view(data)
        size = len(view)
        if not size:
            return bytearray()
        n, encrypt_into, out = self._start_frames(size)
        with memoryview(out) as target:
            pos = 0
            for start in range(0, size, NOISE_MAX_PLAINTEXT):
                chunk = view[start : start + NOISE_MAX_PLAINTEXT]
                length = len(chunk) + NOISE_TAG_LEN
                out[pos] = length >> 8
                out[pos + 1] = length & 0xFF
                encrypt_into(nonce_bytes(n), chunk, None, target[pos + 2 : pos + 2 + length])
                n += 1
                pos += 2 + length
        self._send.n = n
        return out

    def _start_frames(self, size: int):
        """For ``size`` plaintext bytes: the first nonce, the AEAD's ``encrypt_into`` and the output
        buffer sized for every frame (refusing a send that would exhaust the nonce space)."""
        cipher = self._send
        frames = -(-size // NOISE_MAX_PLAINTEXT)
        if cipher.n + frames > cipher.max_nonce:
            raise LocalProtocolError("Noise nonce space exhausted; the connection must be re-established")
        aead = cipher.aead
        assert aead is not None  # keyed: checked in __init__
        return cipher.n, aead.encrypt_into, bytearray(size + frames * _FRAME_OVERHEAD)

    def encrypt_parts(self, parts) -> bytearray:
        """``encrypt(b"".join(parts))`` without the join: the same frames, byte for byte.

        Whole frames are encrypted straight out of each part; only a frame that straddles two
        parts is assembled in a scratch buffer, so at most one frame's worth (65519 bytes) is
        copied per part boundary instead of every byte. This is yamux's output: a 12-byte header
        and a payload of up to 1 MiB, over and over.
        """
        views = [_byte_view(part) for part in parts]
        size = sum(len(view) for view in views)
        if not size:
            return bytearray()
        n, encrypt_into, out = self._start_frames(size)
        pending = bytearray()  # the start of a frame that straddles parts
        with memoryview(out) as target:
            pos = 0

            def emit(chunk) -> None:
                nonlocal pos, n
                length = len(chunk) + NOISE_TAG_LEN
                out[pos] = length >> 8
                out[pos + 1] = length & 0xFF
                encrypt_into(nonce_bytes(n), chunk, None, target[pos + 2 : pos + 2 + length])
                n += 1
                pos += 2 + length

            for view in views:
                start = 0
                if pending:
                    start = min(NOISE_MAX_PLAINTEXT - len(pending), len(view))
                    pending += view[:start]
                    if len(pending) < NOISE_MAX_PLAINTEXT:
                        continue
                    emit(pending)
                    pending = bytearray()
                whole_end = start + (len(view) - start) // NOISE_MAX_PLAINTEXT * NOISE_MAX_PLAINTEXT
                for frame_start in range(start, whole_end, NOISE_MAX_PLAINTEXT):
                    emit(view[frame_start : frame_start + NOISE_MAX_PLAINTEXT])
                if whole_end < len(view):
                    pending = bytearray(view[whole_end:])
            if pending:
                emit(pending)
        self._send.n = n
        return out

    # --- receiving ---------------------------------------------------------------------------
    def receive_data(self, data) -> bytes | bytearray:
        """Add bytes from the wire; return the plaintext of every frame now complete (maybe b"").

        The plaintext is bytes, or a fresh bytearray when several frames completed (copying it
        into bytes would cost one more pass over every received byte); nothing else holds it.

        A frame that fails authentication, or is too short to hold a tag, raises
        RemoteProtocolError; the peer running out of nonces does too.
        """
        if self._error is not None:
            raise RemoteProtocolError(self._error)
        view = _byte_view(data)
        end = len(view)
        pos = 0
        parts: list = []  # bytes (a completed partial frame) or memoryviews of whole ciphertexts
        try:
            if self._partial:
                pos = self._complete_partial(view, parts)
                if not parts:
                    return b""
            while end - pos >= 2:
                length = (view[pos] << 8) | view[pos + 1]
                if length < NOISE_TAG_LEN:
                    raise RemoteProtocolError(f"Noise frame of {length} bytes is shorter than its tag")
                if end - pos - 2 < length:
                    break
                parts.append(view[pos + 2 : pos + 2 + length])
                pos += 2 + length
            if pos < end:
                self._partial += view[pos:]
            return self._decrypt(parts)
        except RemoteProtocolError as exc:
            self._error = str(exc)
            self._partial = bytearray()
            raise

    def _complete_partial(self, view: memoryview, parts: list) -> int:
        """Feed the held-back frame from ``view``; returns how much of ``view`` it took."""
        partial = self._partial
        pos = 0
        if len(partial) < 2:
            pos = min(2 - len(partial), len(view))
            partial += view[:pos]
            if len(partial) < 2:
                return pos
        length = (partial[0] << 8) | partial[1]
        if length < NOISE_TAG_LEN:
            raise RemoteProtocolError(f"Noise frame of {length} bytes is shorter than its tag")
        take = min(2 + length - len(partial), len(view) - pos)
        partial += view[pos : pos + take]
        pos += take
        if len(partial) == 2 + length:
            parts.append(bytes(partial[2:]))
            self._partial = bytearray()
        return pos

    def _decrypt(self, parts: list) -> bytes | bytearray:
        if not parts:
            return b""
        cipher = self._receive
        n = cipher.n
        if n + len(parts) > cipher.max_nonce:
            raise RemoteProtocolError("the peer exhausted the Noise nonce space")
        aead = cipher.aead
        assert aead is not None  # keyed: checked in __init__
        try:
            if len(parts) == 1:
                plaintext = aead.decrypt(nonce_bytes(n), parts[0], None)
                n += 1
                return plaintext
            out = bytearray(sum(len(part) for part in parts) - NOISE_TAG_LEN * len(parts))
            decrypt_into = aead.decrypt_into
            with memoryview(out) as target:
                pos = 0
                for part in parts:
                    size = len(part) - NOISE_TAG_LEN
                    decrypt_into(nonce_bytes(n), part, None, target[pos : pos + size])
                    n += 1
                    pos += size
            return out
        except InvalidTag:
            raise RemoteProtocolError("Noise frame failed authentication") from None
        finally:
            cipher.n = n

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._partial)

    @property
    def send_nonce(self) -> int:
        """Frames sent so far (the next send nonce)."""
        return self._send.n

    @property
    def receive_nonce(self) -> int:
        """Frames received so far (the next receive nonce)."""
        return self._receive.n
