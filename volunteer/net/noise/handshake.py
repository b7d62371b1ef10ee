"""Noise_XX_25519_ChaChaPoly_SHA256 with the libp2p handshake payload (sans-I/O).

    -> e
    <- e, ee, s, es, payload(responder identity)
    -> s, se, payload(initiator identity)

Each side proves its libp2p identity by signing its Noise static key; the stream-muxer
extension carries the muxers each side speaks, so yamux needs no extra negotiation round.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from google.protobuf.message import DecodeError

from ...errors import HandshakeError, LocalProtocolError, PeerIDError, PeerIDMismatch
from ..identity import KeyPair, PeerID, PublicKey
from ..limits import MAX_HANDSHAKE_PAYLOAD, NOISE_MAX_MESSAGE, NOISE_MAX_NONCE, NOISE_TAG_LEN
from ..pb import noise_pb2

PROTOCOL_NAME = b"Noise_XX_25519_ChaChaPoly_SHA256"
SIGNATURE_PREFIX = b"noise-libp2p-static-key:"
DH_LEN = 32


def _hkdf2(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    temp = hmac.digest(chaining_key, ikm, "sha256")
    out1 = hmac.digest(temp, b"\x01", "sha256")
    out2 = hmac.digest(temp, out1 + b"\x02", "sha256")
    return out1, out2


def nonce_bytes(n: int) -> bytes:
    return b"\x00\x00\x00\x00" + n.to_bytes(8, "little")


class CipherState:
    """A key and a nonce counter; refuses to reuse a nonce (the connection must end first)."""

    __slots__ = ("aead", "n", "max_nonce")

    def __init__(self, key: bytes | None, max_nonce: int = NOISE_MAX_NONCE) -> None:
        self.aead = ChaCha20Poly1305(key) if key is not None else None
        self.n = 0
        self.max_nonce = max_nonce

    def _next_nonce(self) -> bytes:
        if self.n >= self.max_nonce:
            raise LocalProtocolError("Noise nonce space exhausted; the connection must be re-established")
        nonce = nonce_bytes(self.n)
        self.n += 1
        return nonce

    def encrypt(self, ad: bytes | None, plaintext) -> bytes:
        if self.aead is None:
            return bytes(plaintext)
        return self.aead.encrypt(self._next_nonce(), plaintext, ad)

    def decrypt(self, ad: bytes | None, ciphertext) -> bytes:
        if self.aead is None:
            return bytes(ciphertext)
        nonce = self._next_nonce()
        try:
            return self.aead.decrypt(nonce, ciphertext, ad)
        except InvalidTag:
            raise HandshakeError("Noise message failed authentication") from None


class SymmetricState:
    def __init__(self) -> None:
        self.h = PROTOCOL_NAME  # exactly 32 bytes: used as is
        self.ck = self.h
        self.cipher = CipherState(None)
        self.mix_hash(b"")  # empty prologue

    def mix_hash(self, data: bytes) -> None:
        self.h = hashlib.sha256(self.h + data).digest()

    def mix_key(self, ikm: bytes) -> None:
        self.ck, temp_k = _hkdf2(self.ck, ikm)
        self.cipher = CipherState(temp_k)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ciphertext = self.cipher.encrypt(self.h, plaintext)
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        plaintext = self.cipher.decrypt(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return plaintext

    def split(self) -> tuple[bytes, bytes]:
        return _hkdf2(self.ck, b"")


def _public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _dh(private: X25519PrivateKey, public: bytes) -> bytes:
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError as exc:  # low-order point: all-zero shared secret
        raise HandshakeError(f"bad Noise public key: {exc}") from None


class Handshake:
    """One side of the XX handshake. Feed it message bodies (without the 2-byte length).

    Initiator: ``write_message()``, ``read_message(m2)``, ``write_message()``.
    Responder: ``read_message(m1)``, ``write_message()``, ``read_message(m3)``.
    ``write_message`` returns the framed message (2-byte length included).
    """

    def __init__(
        self,
        initiator: bool,
        identity: KeyPair,
        muxers: Sequence[str] = (),
        expected_peer: PeerID | None = None,
    ) -> None:
        self.initiator = initiator
        self.identity = identity
        self.muxers = list(muxers)
        self.expected_peer = expected_peer
        self.state = SymmetricState()
        self.static = X25519PrivateKey.generate()
        self.ephemeral: X25519PrivateKey | None = None
        self.remote_ephemeral: bytes | None = None
        self.remote_static: bytes | None = None
        self.remote_public_key: PublicKey | None = None
        self.remote_peer: PeerID | None = None
        self.remote_muxers: list[str] = []
        self.step = 0  # messages processed so far (0..3)

    @property
    def complete(self) -> bool:
        return self.step == 3

    def _our_turn(self) -> bool:
        return (self.step % 2 == 0) == self.initiator

    def _payload(self) -> bytes:
        static_pub = _public_bytes(self.static)
        payload = noise_pb2.NoiseHandshakePayload(
            identity_key=self.identity.public_key.to_protobuf(),
            identity_sig=self.identity.sign(SIGNATURE_PREFIX + static_pub),
        )
        if self.muxers:
            payload.extensions.stream_muxers.extend(self.muxers)
        return payload.SerializeToString()

    def write_message(self) -> bytes:
        if self.complete or not self._our_turn():
            raise LocalProtocolError("not our turn to send a Noise handshake message")
        out = bytearray()
        st = self.state
        if self.step == 0:  # -> e
            self.ephemeral = X25519PrivateKey.generate()
            e_pub = _public_bytes(self.ephemeral)
            st.mix_hash(e_pub)
            out += e_pub
            out += st.encrypt_and_hash(b"")
        elif self.step == 1:  # <- e, ee, s, es, payload
            self.ephemeral = X25519PrivateKey.generate()
            e_pub = _public_bytes(self.ephemeral)
            st.mix_hash(e_pub)
            out += e_pub
            st.mix_key(_dh(self.ephemeral, self.remote_ephemeral))
            out += st.encrypt_and_hash(_public_bytes(self.static))
            st.mix_key(_dh(self.static, self.remote_ephemeral))
            out += st.encrypt_and_hash(self._payload())
        else:  # -> s, se, payload
            out += st.encrypt_and_hash(_public_bytes(self.static))
            st.mix_key(_dh(self.static, self.remote_ephemeral))
            out += st.encrypt_and_hash(self._payload())
        self.step += 1
        if len(out) > NOISE_MAX_MESSAGE:
            raise LocalProtocolError("Noise handshake message too large")
        return len(out).to_bytes(2, "big") + bytes(out)

    def read_message(self, message: bytes) -> None:
        if self.complete or self._our_turn():
            raise HandshakeError("unexpected Noise handshake message")
        message = bytes(message)
        st = self.state
        try:
            if self.step == 0:  # -> e
                self._read_ephemeral(message)
                st.decrypt_and_hash(message[DH_LEN:])
            elif self.step == 1:  # <- e, ee, s, es, payload
                self._read_ephemeral(message)
                st.mix_key(_dh(self.ephemeral, self.remote_ephemeral))
                rest = message[DH_LEN:]
                self._read_static(rest[: DH_LEN + NOISE_TAG_LEN])
                st.mix_key(_dh(self.ephemeral, self.remote_static))
                self._read_payload(st.decrypt_and_hash(rest[DH_LEN + NOISE_TAG_LEN :]))
            else:  # -> s, se, payload
                self._read_static(message[: DH_LEN + NOISE_TAG_LEN])
                st.mix_key(_dh(self.ephemeral, self.remote_static))
                self._read_payload(st.decrypt_and_hash(message[DH_LEN + NOISE_TAG_LEN :]))
        except HandshakeError:
            raise
        except (ValueError, IndexError) as exc:
            raise HandshakeError(f"malformed Noise handshake message: {exc}") from None
        self.step += 1

    def _read_ephemeral(self, message: bytes) -> None:
        if len(message) < DH_LEN:
            raise HandshakeError("Noise handshake message too short for an ephemeral key")
        self.remote_ephemeral = message[:DH_LEN]
        self.state.mix_hash(self.remote_ephemeral)

    def _read_static(self, encrypted: bytes) -> None:
        if len(encrypted) != DH_LEN + NOISE_TAG_LEN:
            raise HandshakeError("Noise handshake message too short for a static key")
        self.remote_static = self.state.decrypt_and_hash(encrypted)

    def _read_payload(self, data: bytes) -> None:
        if len(data) > MAX_HANDSHAKE_PAYLOAD:
            raise HandshakeError(f"Noise handshake payload of {len(data)} bytes is too large")
        payload = noise_pb2.NoiseHandshakePayload()
        try:
            payload.ParseFromString(data)
        except DecodeError as exc:
            raise HandshakeError(f"malformed Noise handshake payload: {exc}") from None
        if not payload.identity_key or not payload.identity_sig:
            raise HandshakeError("Noise handshake payload lacks the identity key or signature")
        try:
            key = PublicKey.from_protobuf(payload.identity_key)
        except PeerIDError as exc:
            raise HandshakeError(f"bad identity key in Noise payload: {exc}") from None
        if not key.verify(SIGNATURE_PREFIX + self.remote_static, payload.identity_sig):
            raise HandshakeError("Noise payload signature does not match the peer's static key")
        peer = PeerID.from_public_key(key)
        if self.expected_peer is not None and peer != self.expected_peer:
            raise PeerIDMismatch(f"dialled {self.expected_peer} but {peer} answered")
        self.remote_public_key = key
        self.remote_peer = peer
        self.remote_muxers = [m for m in payload.extensions.stream_muxers][:16]

    def split(self, max_nonce: int = NOISE_MAX_NONCE) -> tuple[CipherState, CipherState]:
        """(send, receive) cipher states for the transport phase."""
        if not self.complete:
            raise LocalProtocolError("handshake not complete")
        k1, k2 = self.state.split()
        first, second = CipherState(k1, max_nonce), CipherState(k2, max_nonce)
        return (first, second) if self.initiator else (second, first)
