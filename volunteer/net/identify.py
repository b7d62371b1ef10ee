"""identify (`/ipfs/id/1.0.0`) and identify push (`/ipfs/id/push/1.0.0`).

The responder of an identify stream writes one varint-delimited Identify protobuf and closes; a
pusher opens a push stream and writes its own. Encoding/decoding is pure; ``read_identify`` and
``write_identify`` are the thin stream parts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from ..errors import MultiaddrError, PeerIDError, RemoteProtocolError
from .identity import PeerID, PublicKey
from .limits import MAX_IDENTIFY_ADDRS, MAX_IDENTIFY_MESSAGE, MAX_IDENTIFY_PROTOCOLS
from .multiaddr import Multiaddr
from .pb import identify_pb2
from .streams import BufferedStream
from .varint import decode_uvarint, encode_uvarint

log = logging.getLogger(__name__)

IDENTIFY = "/ipfs/id/1.0.0"
IDENTIFY_PUSH = "/ipfs/id/push/1.0.0"
PROTOCOL_VERSION = "ipfs/0.1.0"


@dataclass
class IdentifyInfo:
    """The decoded content of an Identify message (fields the peer left out are empty)."""

    public_key: PublicKey | None = None
    listen_addrs: list[Multiaddr] = field(default_factory=list)
    protocols: list[str] = field(default_factory=list)
    observed_addr: Multiaddr | None = None
    agent_version: str = ""
    protocol_version: str = ""
    signed_peer_record: bytes = b""

    @property
    def peer_id(self) -> PeerID | None:
        return PeerID.from_public_key(self.public_key) if self.public_key else None


def encode_identify(info: IdentifyInfo) -> bytes:
    """The Identify protobuf, varint-delimited as go-libp2p and the spec write it."""
    msg = identify_pb2.Identify()
    msg.protocolVersion = info.protocol_version or PROTOCOL_VERSION
    msg.agentVersion = info.agent_version
    if info.public_key is not None:
        msg.publicKey = info.public_key.to_protobuf()
    msg.listenAddrs.extend(addr.to_bytes() for addr in info.listen_addrs[:MAX_IDENTIFY_ADDRS])
    msg.protocols.extend(info.protocols[:MAX_IDENTIFY_PROTOCOLS])
    if info.observed_addr is not None:
        msg.observedAddr = info.observed_addr.to_bytes()
    if info.signed_peer_record:
        msg.signedPeerRecord = info.signed_peer_record
    body = msg.SerializeToString()
    return encode_uvarint(len(body)) + body


def _split_delimited(data: bytes) -> list[bytes] | None:
    """Split ``data`` into varint-delimited messages, or None if it is not exactly such a sequence."""
    parts = []
    pos = 0
    try:
        while pos < len(data):
            decoded = decode_uvarint(data, pos)
            if decoded is None:
                return None
            length, pos = decoded
            if pos + length > len(data):
                return None
            parts.append(data[pos : pos + length])
            pos += length
    except RemoteProtocolError:
        return None
    return parts


def _parse_delimited(data: bytes):
    parts = _split_delimited(data)
    if parts is None:
        return None
    msg = identify_pb2.Identify()
    try:
        for part in parts:
            msg.MergeFromString(part)
    except DecodeError:
        return None
    return msg


def decode_identify(data: bytes) -> IdentifyInfo:
    """Decode what an identify responder sent before closing.

    go-libp2p may split a large message into several delimited ones (they merge); some older
    implementations send the protobuf without a length prefix, which we accept too.
    """
    if len(data) > MAX_IDENTIFY_MESSAGE:
        raise RemoteProtocolError(f"identify message of {len(data)} bytes exceeds {MAX_IDENTIFY_MESSAGE}")
    msg = _parse_delimited(data)
    if msg is None:
        msg = identify_pb2.Identify()
        try:
            msg.ParseFromString(data)
        except DecodeError as exc:
            raise RemoteProtocolError(f"malformed identify message: {exc}") from None

    info = IdentifyInfo(
        agent_version=msg.agentVersion[:256],
        protocol_version=msg.protocolVersion[:64],
        protocols=[p for p in msg.protocols[:MAX_IDENTIFY_PROTOCOLS] if len(p) <= 256],
        signed_peer_record=msg.signedPeerRecord,
    )
    if msg.HasField("publicKey"):
        try:
            info.public_key = PublicKey.from_protobuf(msg.publicKey)
        except PeerIDError as exc:
            raise RemoteProtocolError(f"identify carries a bad public key: {exc}") from None
    for raw in msg.listenAddrs[:MAX_IDENTIFY_ADDRS]:
        try:
            info.listen_addrs.append(Multiaddr.from_bytes(raw))
        except MultiaddrError:
            # Peers advertise transports we do not know (webrtc, certhash…): skip those addresses.
            log.debug("identify: skipping an address we cannot parse")
    if msg.HasField("observedAddr"):
        try:
            info.observed_addr = Multiaddr.from_bytes(msg.observedAddr)
        except MultiaddrError:
            log.debug("identify: unparsable observed address")
    return info


async def write_identify(stream, info: IdentifyInfo) -> None:
    """Send our Identify on ``stream`` and close our side."""
    await stream.send_all(encode_identify(info))
    await stream.send_eof()


async def read_identify(stream) -> IdentifyInfo:
    """Read a whole Identify message (until the peer closes its side)."""
    buffered = stream if isinstance(stream, BufferedStream) else BufferedStream(stream)
    data = await buffered.receive_until_eof(MAX_IDENTIFY_MESSAGE, "identify message")
    return decode_identify(data)
