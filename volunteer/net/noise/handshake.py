"""Noise_XX_25519_ChaChaPoly_SHA256 with the libp2p handshake payload (sans-I/O).

    -> e                               (empty payload)
    <- e, ee, s, es, payload(responder identity)
    -> s, se, payload(initiator identity)

The symmetric state follows the Noise Protocol Framework, revision 34: HKDF over HMAC-SHA256,
MixHash/MixKey, an empty prologue. Every message travels with a 2-byte big-endian length.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ...errors import HandshakeError, LocalProtocolError, RemoteProtocolError
from ..identity import KeyPair, PeerID, PublicKey
from ..limits import NOISE_MAX_MESSAGE, NOISE_MAX_NONCE, NOISE_TAG_LEN
from .payload import encode_payload, verify_payload
from .transport import CipherState, NoiseTransport

PROTOCOL_NAME = b"Noise_XX_25519_ChaChaPoly_SHA256"
DH_LEN = 32
HASH_LEN = 32
_STATIC_LEN = DH_LEN + NOISE_TAG_LEN  # an encrypted static key


def hkdf(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    """Noise's HKDF with two outputs (HMAC-SHA256)."""
    temp = hmac.digest(chaining_key, ikm, "sha256")
    out1 = hmac.digest(temp, b"\x01", "sha256")
    out2 = hmac.digest(temp, out1 + b"\x02", "sha256")
    return out1, out2


class SymmetricState:
    """The Noise SymmetricState: chaining key ``ck``, handshake hash ``h`` and a CipherState."""

    def __init__(self, protocol_name: bytes = PROTOCOL_NAME, prologue: bytes = b"") -> None:
        # Names up to HASHLEN bytes are zero-padded, longer ones hashed (ours is exactly 32).
        if len(protocol_name) <= HASH_LEN:
            self.h = protocol_name.ljust(HASH_LEN, b"\x00")
        else:
            self.h = hashlib.sha256(protocol_name).digest()
        self.ck = self.h
        self.cipher = CipherState(None)
        self.mix_hash(prologue)

    def mix_hash(self, data: bytes) -> None:
        """h = SHA256(h || data)."""
        self.h = hashlib.sha256(self.h + data).digest()

    def mix_key(self, ikm: bytes) -> None:
        """Derive a new chaining key and a fresh cipher key (nonce back to 0) from a DH output."""
        self.ck, key = hkdf(self.ck, ikm)
        self.cipher = CipherState(key)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        """Encrypt with h as associated data, then mix the ciphertext into h."""
        ciphertext = self.cipher.encrypt(self.h, plaintext)
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        """Decrypt with h as associated data (RemoteProtocolError on a bad tag), then mix it into h."""
        plaintext = self.cipher.decrypt(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return plaintext

    def split(self, max_nonce: int = NOISE_MAX_NONCE) -> tuple[CipherState, CipherState]:
        """The two transport CipherStates: (initiator → responder, responder → initiator)."""
        k1, k2 = hkdf(self.ck, b"")
        return CipherState(k1, max_nonce), CipherState(k2, max_nonce)


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The raw 32-byte X25519 public key (RFC 7748 encoding)."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _dh(private: X25519PrivateKey | None, public: bytes | None) -> bytes:
    # The XX pattern sets each key (ours or the peer's) one step before its first use, so a None
    # here is a bug in this module, not something a peer can cause.
    assert private is not None and public is not None, "Noise key used before the step that sets it"
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError as exc:  # a low-order point gives an all-zero secret, which cryptography refuses
        raise HandshakeError(f"bad Noise public key from the peer: {exc}") from None


class Handshake:
    """One side of the libp2p Noise XX handshake, without I/O.

    Outgoing: ``write_message()`` returns the next message, 2-byte length included.
    Incoming: ``receive_data(data)`` takes bytes as they arrive, buffers partial frames, and
    returns True once it has processed a whole message (``read_message(body)`` takes one
    unframed message instead). ``our_turn`` says which to do next; ``complete`` when done.
    Bytes after the last message belong to the transport phase: ``take_buffered()``.

    Afterwards ``remote_peer``, ``remote_public_key`` and ``remote_muxers`` are verified, and
    ``send_cipher``/``receive_cipher`` (or ``transport()``) carry the session keys.
    A dialled peer that turns out to be someone else raises PeerIDMismatch; anything else the
    peer gets wrong raises HandshakeError, after which the handshake is dead.
    """

    def __init__(
        self,
        initiator: bool,
        identity: KeyPair,
        muxers: Sequence[str] = (),
        expected_peer: PeerID | None = None,
        *,
        prologue: bytes = b"",
        static_key: X25519PrivateKey | None = None,
        ephemeral_key: X25519PrivateKey | None = None,
    ) -> None:
        self.initiator = initiator
        self.identity = identity
        self.muxers = list(muxers)
        self.expected_peer = expected_peer
        self.state = SymmetricState(PROTOCOL_NAME, prologue)  # libp2p over TCP: empty prologue
        # A fresh Noise static key per handshake: its only job is to be signed by the identity key.
        self.static = static_key if static_key is not None else X25519PrivateKey.generate()
        self.ephemeral: X25519PrivateKey | None = None
        self._fixed_ephemeral = ephemeral_key  # test vectors only: ephemerals must be fresh
        self.remote_ephemeral: bytes | None = None
        self.remote_static: bytes | None = None
        self.remote_public_key: PublicKey | None = None
        self.remote_peer: PeerID | None = None
        self.remote_muxers: list[str] = []
        self.send_cipher: CipherState | None = None
        self.receive_cipher: CipherState | None = None
        self.step = 0  # messages sent or received so far (0..3)
        self.failed = False
        self._buffer = bytearray()

    # --- state -------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """All three messages are through and the peer is authenticated."""
        return self.step == 3

    @property
    def our_turn(self) -> bool:
        """Whether the next message is ours to write (False when complete or failed)."""
        return not self.complete and not self.failed and (self.step % 2 == 0) == self.initiator

    # --- writing -----------------------------------------------------------------------------
    def write_message(self) -> bytes:
        """The next handshake message, framed. LocalProtocolError when it is not our turn."""
        if not self.our_turn:
            raise LocalProtocolError("not our turn to send a Noise handshake message")
        st = self.state
        try:
            if self.step == 0:  # -> e
                body = self._write_ephemeral()
            elif self.step == 1:  # <- e, ee, s, es
                body = self._write_ephemeral()
                st.mix_key(_dh(self.ephemeral, self.remote_ephemeral))
                body += st.encrypt_and_hash(public_bytes(self.static))
                st.mix_key(_dh(self.static, self.remote_ephemeral))
            else:  # -> s, se
                body = st.encrypt_and_hash(public_bytes(self.static))
                st.mix_key(_dh(self.static, self.remote_ephemeral))
            body += st.encrypt_and_hash(self._outgoing_payload())
        except HandshakeError:
            self.failed = True
            raise
        if len(body) > NOISE_MAX_MESSAGE:
            self.failed = True
            raise LocalProtocolError(f"Noise handshake message of {len(body)} bytes is too large")
        self._advance()
        return len(body).to_bytes(2, "big") + body

    def _write_ephemeral(self) -> bytes:
        self.ephemeral = self._fixed_ephemeral or X25519PrivateKey.generate()
        e_pub = public_bytes(self.ephemeral)
        self.state.mix_hash(e_pub)
        return e_pub

    def _outgoing_payload(self) -> bytes:
        # Message 1 carries no payload in libp2p (it could only be sent in the clear).
        if self.step == 0:
            return b""
        return encode_payload(self.identity, public_bytes(self.static), self.muxers)

    # --- reading -----------------------------------------------------------------------------
    def receive_data(self, data) -> bool:
        """Buffer ``data``; if a whole message from the peer is there, process it and return True.

        Call it again (with b"") to process a further message already buffered.
        """
        if self.complete:
            raise LocalProtocolError("the Noise handshake is complete; pass further bytes to the transport")
        if self.failed:
            raise HandshakeError("the Noise handshake already failed")
        buffer = self._buffer
        buffer += data
        if self.our_turn:
            # The peer may not speak now; hold what it sent, but not without bound.
            if len(buffer) > 2 + NOISE_MAX_MESSAGE:
                self.failed = True
                raise HandshakeError("the peer sent Noise handshake data out of turn")
            return False
        if len(buffer) < 2:
            return False
        end = 2 + ((buffer[0] << 8) | buffer[1])
        if len(buffer) < end:
            return False
        body = bytes(buffer[2:end])
        del buffer[:end]
        self.read_message(body)
        return True

    def take_buffered(self) -> bytes:
        """Remove and return the bytes received but not part of a handshake message."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def read_message(self, body: bytes) -> None:
        """Process one message from the peer (without its length prefix)."""
        if self.failed:
            raise HandshakeError("the Noise handshake already failed")
        if self.complete or self.our_turn:
            raise LocalProtocolError("not the peer's turn to send a Noise handshake message")
        body = bytes(body)
        st = self.state
        try:
            if self.step == 0:  # -> e
                rest = self._read_ephemeral(body)
            elif self.step == 1:  # <- e, ee, s, es
                rest = self._read_ephemeral(body)
                st.mix_key(_dh(self.ephemeral, self.remote_ephemeral))
                rest = self._read_static(rest)
                st.mix_key(_dh(self.ephemeral, self.remote_static))
            else:  # -> s, se
                rest = self._read_static(body)
                st.mix_key(_dh(self.ephemeral, self.remote_static))
            if self.step and len(rest) < NOISE_TAG_LEN:
                raise HandshakeError("Noise handshake message too short for its payload")
            self._incoming_payload(st.decrypt_and_hash(rest))
        except RemoteProtocolError as exc:
            self.failed = True
            raise HandshakeError(f"Noise handshake message {self.step + 1}: {exc}") from None
        except HandshakeError:
            self.failed = True
            raise
        self._advance()

    def _read_ephemeral(self, body: bytes) -> bytes:
        if len(body) < DH_LEN:
            raise HandshakeError(f"Noise handshake message of {len(body)} bytes is too short for an ephemeral key")
        self.remote_ephemeral = body[:DH_LEN]
        self.state.mix_hash(self.remote_ephemeral)
        return body[DH_LEN:]

    def _read_static(self, body: bytes) -> bytes:
        if len(body) < _STATIC_LEN:
            raise HandshakeError("Noise handshake message too short for a static key")
        self.remote_static = self.state.decrypt_and_hash(body[:_STATIC_LEN])
        return body[_STATIC_LEN:]

    def _incoming_payload(self, plaintext: bytes) -> None:
        if self.step == 0:
            return  # sent in the clear, so it proves nothing; libp2p peers send it empty
        assert self.remote_static is not None  # _read_static ran earlier in this same message
        identity = verify_payload(plaintext, self.remote_static, self.expected_peer)
        self.remote_public_key = identity.public_key
        self.remote_peer = identity.peer_id
        self.remote_muxers = identity.muxers

    def _advance(self) -> None:
        self.step += 1
        if self.complete:
            first, second = self.state.split()
            self.send_cipher, self.receive_cipher = (first, second) if self.initiator else (second, first)
            self.ephemeral = None  # forward secrecy: nothing left to derive from

    # --- after completion ----------------------------------------------------------------------
    def split(self, max_nonce: int | None = None) -> tuple[CipherState, CipherState]:
        """(send, receive) cipher states; ``max_nonce`` lowers the nonce limit (for tests)."""
        if not self.complete:
            raise LocalProtocolError("the Noise handshake is not complete")
        assert self.send_cipher is not None and self.receive_cipher is not None  # set by _advance on completion
        if max_nonce is not None:
            self.send_cipher.max_nonce = self.receive_cipher.max_nonce = max_nonce
        return self.send_cipher, self.receive_cipher

    def transport(self, max_nonce: int | None = None) -> NoiseTransport:
        """A NoiseTransport over this handshake's session keys."""
        return NoiseTransport(*self.split(max_nonce))

    @property
    def handshake_hash(self) -> bytes:
        """The final handshake hash h (channel binding; equal on both sides)."""
        return self.state.h
