"""Noise transport phase (sans-I/O): plaintext in, 2-byte-framed ciphertext out, and back."""

from __future__ import annotations

from cryptography.exceptions import InvalidTag

from ...errors import LocalProtocolError, RemoteProtocolError
from ..limits import NOISE_MAX_PLAINTEXT, NOISE_TAG_LEN
from .handshake import CipherState

_ZERO4 = b"\x00\x00\x00\x00"


class NoiseTransport:
    """Encrypts outgoing data into frames and decrypts incoming frames, keeping partial ones."""

    def __init__(self, send: CipherState, receive: CipherState) -> None:
        self._send = send
        self._receive = receive
        self._inbound = bytearray()

    def encrypt(self, data) -> bytes:
        """Frames of at most 65519 plaintext bytes each, concatenated into one bytes object."""
        view = memoryview(data)
        cipher = self._send
        aead = cipher.aead
        n = cipher.n
        if n + (len(view) // NOISE_MAX_PLAINTEXT) + 1 >= cipher.max_nonce:
            raise LocalProtocolError("Noise nonce space exhausted; the connection must be re-established")
        parts = []
        for start in range(0, len(view), NOISE_MAX_PLAINTEXT):
            chunk = view[start : start + NOISE_MAX_PLAINTEXT]
            ciphertext = aead.encrypt(_ZERO4 + n.to_bytes(8, "little"), chunk, None)
            n += 1
            parts.append(len(ciphertext).to_bytes(2, "big"))
            parts.append(ciphertext)
        cipher.n = n
        return b"".join(parts)

    def receive_data(self, data) -> bytes:
        """Add bytes from the wire; return the plaintext of every frame now complete."""
        if self._inbound:
            self._inbound += data
            source = self._inbound
        else:
            source = data  # the common case: decrypt straight from what the socket gave us
        view = memoryview(source)
        end = len(source)
        pos = 0
        cipher = self._receive
        aead = cipher.aead
        n = cipher.n
        out = []
        try:
            while end - pos >= 2:
                length = (source[pos] << 8) | source[pos + 1]
                if end - pos - 2 < length:
                    break
                if length < NOISE_TAG_LEN:
                    raise RemoteProtocolError(f"Noise frame of {length} bytes is shorter than its tag")
                if n >= cipher.max_nonce:
                    raise RemoteProtocolError("peer exhausted the Noise nonce space")
                try:
                    out.append(aead.decrypt(_ZERO4 + n.to_bytes(8, "little"), view[pos + 2 : pos + 2 + length], None))
                except InvalidTag:
                    raise RemoteProtocolError("Noise frame failed authentication") from None
                n += 1
                pos += 2 + length
        finally:
            cipher.n = n
            rest = view[pos:]
            if source is self._inbound:
                rest.release()
                view.release()
                del self._inbound[:pos]
            else:
                self._inbound = bytearray(rest)
                rest.release()
                view.release()
        return b"".join(out) if len(out) != 1 else out[0]

    @property
    def pending(self) -> int:
        """Bytes of incomplete frames held back."""
        return len(self._inbound)
