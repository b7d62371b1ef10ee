"""Signed envelopes (libp2p RFC 0002) and peer records (RFC 0003).

An envelope carries a payload, its type, the signer's public key and a signature over
varint-prefixed (domain, payload type, payload); the domain keeps a signature made for one
purpose (a relay voucher, say) from being replayed for another.
"""

from __future__ import annotations


from ..errors import MultiaddrError, PeerIDError, RemoteProtocolError
from .identity import KeyPair, PeerID, PublicKey
from .multiaddr import Multiaddr
from .pb import envelope_pb2, keys_pb2
from .pb.decode import parse
from .varint import encode_uvarint

MAX_ENVELOPE = 8192
PEER_RECORD_DOMAIN = "libp2p-peer-record"
PEER_RECORD_PAYLOAD_TYPE = b"\x03\x01"


def _signed_bytes(domain: str, payload_type: bytes, payload: bytes) -> bytes:
    domain_bytes = domain.encode()
    return b"".join(
        encode_uvarint(len(part)) + part for part in (domain_bytes, payload_type, payload)
    )


def seal(keypair: KeyPair, domain: str, payload_type: bytes, payload: bytes) -> bytes:
    """Sign ``payload`` for ``domain`` and wrap it in an Envelope protobuf."""
    envelope = envelope_pb2.Envelope(
        payload_type=payload_type,
        payload=payload,
        signature=keypair.sign(_signed_bytes(domain, payload_type, payload)),
    )
    envelope.public_key.CopyFrom(keys_pb2.PublicKey(Type=keypair.public_key.key_type, Data=keypair.public_key.raw))
    return envelope.SerializeToString()


def open_envelope(data: bytes, domain: str) -> tuple[PublicKey, bytes, bytes]:
    """Verify an envelope for ``domain``: (signer's key, payload type, payload)."""
    if len(data) > MAX_ENVELOPE:
        raise RemoteProtocolError(f"envelope of {len(data)} bytes exceeds {MAX_ENVELOPE}")
    envelope = parse(envelope_pb2.Envelope, data, "envelope")
    try:
        key = PublicKey(envelope.public_key.Type, envelope.public_key.Data)
    except PeerIDError as exc:
        raise RemoteProtocolError(f"malformed envelope: {exc}") from None
    if not key.verify(_signed_bytes(domain, envelope.payload_type, envelope.payload), envelope.signature):
        raise RemoteProtocolError(f"envelope signature invalid for domain {domain!r}")
    return key, envelope.payload_type, envelope.payload


def make_peer_record(keypair: KeyPair, addrs: list[Multiaddr], seq: int) -> bytes:
    """A sealed peer record: our addresses, with a sequence number (newer wins)."""
    record = envelope_pb2.PeerRecord(peer_id=keypair.peer_id.to_bytes(), seq=seq)
    for addr in addrs:
        record.addresses.add(multiaddr=addr.to_bytes())
    return seal(keypair, PEER_RECORD_DOMAIN, PEER_RECORD_PAYLOAD_TYPE, record.SerializeToString())


def parse_peer_record(data: bytes) -> tuple[PeerID, int, list[Multiaddr]]:
    """Verify a sealed peer record; the signer must be the peer it describes."""
    key, payload_type, payload = open_envelope(data, PEER_RECORD_DOMAIN)
    if payload_type != PEER_RECORD_PAYLOAD_TYPE:
        raise RemoteProtocolError("envelope does not hold a peer record")
    record = parse(envelope_pb2.PeerRecord, payload, "peer record")
    try:
        peer = PeerID.from_bytes(record.peer_id)
        addrs = [Multiaddr.from_bytes(a.multiaddr) for a in record.addresses]
    except (PeerIDError, MultiaddrError) as exc:
        raise RemoteProtocolError(f"malformed peer record: {exc}") from None
    if not peer.matches(key):
        raise RemoteProtocolError("peer record signed by another peer")
    return peer, record.seq, addrs
