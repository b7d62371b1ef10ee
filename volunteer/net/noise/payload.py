"""The libp2p Noise handshake payload: identity key, signature over the Noise static key, muxers.

The signature binds the per-connection X25519 static key to the peer's libp2p identity key:
``sign("noise-libp2p-static-key:" + static_public)``. The stream-muxer extension lists the
muxers the sender speaks, so the muxer needs no multistream round after the handshake.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm

from ...errors import HandshakeError, LocalProtocolError, PeerIDError, PeerIDMismatch, RemoteProtocolError
from ..identity import KeyPair, PeerID, PublicKey
from ..limits import MAX_HANDSHAKE_PAYLOAD, NOISE_MAX_MUXER_NAME, NOISE_MAX_MUXERS
from ..pb import noise_pb2
from ..pb.decode import parse

SIGNATURE_PREFIX = b"noise-libp2p-static-key:"


@dataclass(frozen=True)
class RemoteIdentity:
    """What a verified payload proves: the peer's identity key, its peer ID and its muxers."""

    public_key: PublicKey
    peer_id: PeerID
    muxers: list[str]


def encode_payload(identity: KeyPair, static_public: bytes, muxers: Sequence[str] = ()) -> bytes:
    """Our payload for ``static_public`` (the raw 32-byte X25519 public key)."""
    muxers = list(muxers)
    if len(muxers) > NOISE_MAX_MUXERS or any(len(m.encode()) > NOISE_MAX_MUXER_NAME for m in muxers):
        raise LocalProtocolError("too many or too long muxer ids for the Noise handshake")
    payload = noise_pb2.NoiseHandshakePayload(
        identity_key=identity.public_key.to_protobuf(),
        identity_sig=identity.sign(SIGNATURE_PREFIX + static_public),
    )
    if muxers:
        payload.extensions.stream_muxers.extend(muxers)
    data = payload.SerializeToString()
    if len(data) > MAX_HANDSHAKE_PAYLOAD:
        raise LocalProtocolError(f"Noise handshake payload of {len(data)} bytes is too large")
    return data


def verify_payload(data: bytes, static_public: bytes, expected_peer: PeerID | None = None) -> RemoteIdentity:
    """Parse the peer's payload and check its signature over ``static_public``.

    HandshakeError for anything wrong with it; PeerIDMismatch (a HandshakeError) when the
    payload is valid but belongs to someone other than ``expected_peer``.
    """
    if len(data) > MAX_HANDSHAKE_PAYLOAD:
        raise HandshakeError(f"Noise handshake payload of {len(data)} bytes is too large")
    try:
        payload = parse(noise_pb2.NoiseHandshakePayload, data, "Noise handshake payload")
    except RemoteProtocolError as exc:
        raise HandshakeError(str(exc)) from None
    if not payload.identity_key:
        raise HandshakeError("Noise handshake payload lacks the identity key")
    if not payload.identity_sig:
        raise HandshakeError("Noise handshake payload lacks the static key signature")
    try:
        key = PublicKey.from_protobuf(payload.identity_key)
        valid = key.verify(SIGNATURE_PREFIX + bytes(static_public), payload.identity_sig)
    except (PeerIDError, ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise HandshakeError(f"bad identity key in Noise payload: {exc}") from None
    if not valid:
        raise HandshakeError("Noise payload signature does not match the peer's static key")
    peer = PeerID.from_public_key(key)
    if expected_peer is not None and peer != expected_peer:
        raise PeerIDMismatch.between(expected_peer, peer)
    muxers = list(payload.extensions.stream_muxers) if payload.HasField("extensions") else []
    if len(muxers) > NOISE_MAX_MUXERS:
        raise HandshakeError(f"peer listed {len(muxers)} muxers in the Noise handshake (limit {NOISE_MAX_MUXERS})")
    if any(len(m.encode()) > NOISE_MAX_MUXER_NAME for m in muxers):
        raise HandshakeError("peer listed an over-long muxer id in the Noise handshake")
    return RemoteIdentity(key, peer, muxers)
