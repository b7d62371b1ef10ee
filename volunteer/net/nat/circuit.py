"""Circuit relay v2 messages (specs: relay/circuit-v2.md): encoding, statuses, vouchers.

Hop and stop messages are varint-delimited protobufs of at most 4 KiB. Decoding failures raise
RemoteProtocolError; the relay answers them with MALFORMED_MESSAGE.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import PeerIDError, RemoteProtocolError
from .. import limits
from ..envelope import open_envelope, seal
from ..identity import KeyPair, PeerID
from ..pb import circuit_pb2
from ..pb.decode import parse
from ..streams import BufferedStream
from ..varint import encode_uvarint

HOP = "/libp2p/circuit/relay/0.2.0/hop"
STOP = "/libp2p/circuit/relay/0.2.0/stop"
MAX_MESSAGE = limits.CIRCUIT_MAX_MESSAGE
VOUCHER_DOMAIN = "libp2p-relay-rsvp"
VOUCHER_PAYLOAD_TYPE = b"\x03\x02"

HopMessage = circuit_pb2.HopMessage
StopMessage = circuit_pb2.StopMessage
Status = circuit_pb2.Status
OK = circuit_pb2.OK
RESERVATION_REFUSED = circuit_pb2.RESERVATION_REFUSED
RESOURCE_LIMIT_EXCEEDED = circuit_pb2.RESOURCE_LIMIT_EXCEEDED
PERMISSION_DENIED = circuit_pb2.PERMISSION_DENIED
CONNECTION_FAILED = circuit_pb2.CONNECTION_FAILED
NO_RESERVATION = circuit_pb2.NO_RESERVATION
MALFORMED_MESSAGE = circuit_pb2.MALFORMED_MESSAGE
UNEXPECTED_MESSAGE = circuit_pb2.UNEXPECTED_MESSAGE


def status_name(status: int) -> str:
    """The spec's name of a status code (for errors and refusal counters)."""
    try:
        return circuit_pb2.Status.Name(status)
    except ValueError:
        return f"status {status}"


@dataclass(frozen=True)
class Limit:
    """Per-circuit limits the relay applies: seconds (0 = none) and bytes per direction (0 = none)."""

    duration: int = 0
    data: int = 0

    def to_pb(self) -> circuit_pb2.Limit:
        return circuit_pb2.Limit(duration=self.duration, data=self.data)

    @classmethod
    def from_pb(cls, message: circuit_pb2.Limit) -> "Limit":
        return cls(duration=message.duration, data=message.data)


def encode(message) -> bytes:
    """A delimited hop or stop message (ValueError if over MAX_MESSAGE: our own bug)."""
    body = message.SerializeToString()
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"circuit message of {len(body)} bytes exceeds {MAX_MESSAGE}")
    return encode_uvarint(len(body)) + body


def decode(data: bytes, cls):
    """One hop, stop or voucher message from its body (RemoteProtocolError if malformed)."""
    return parse(cls, data, cls.__name__)


async def read_message(stream: BufferedStream, cls):
    """Read one delimited hop or stop message (RemoteProtocolError if malformed or too big)."""
    return decode(await stream.receive_length_prefixed(MAX_MESSAGE, cls.__name__), cls)


async def write_message(stream, message) -> None:
    """Send one delimited hop or stop message."""
    await stream.send_all(encode(message))


def peer_of(message) -> PeerID:
    """The PeerID in a message's ``peer`` field, or RemoteProtocolError."""
    if not message.HasField("peer"):
        raise RemoteProtocolError("message lacks the peer field")
    try:
        return PeerID.from_bytes(message.peer.id)
    except PeerIDError as exc:
        raise RemoteProtocolError(f"bad peer id: {exc}") from None


def make_voucher(relay: KeyPair, peer: PeerID, expiration: int) -> bytes:
    """A reservation voucher: the relay's signed word that it will relay for ``peer``."""
    payload = circuit_pb2.ReservationVoucher(relay=relay.peer_id.to_bytes(), peer=peer.to_bytes(), expiration=expiration)
    return seal(relay, VOUCHER_DOMAIN, VOUCHER_PAYLOAD_TYPE, payload.SerializeToString())


def verify_voucher(data: bytes, relay: PeerID, peer: PeerID) -> int:
    """Check a voucher was signed by ``relay`` for ``peer``; returns its expiration (UNIX s)."""
    key, payload_type, payload = open_envelope(data, VOUCHER_DOMAIN)
    if payload_type != VOUCHER_PAYLOAD_TYPE or not relay.matches(key):
        raise RemoteProtocolError("voucher not signed by the relay")
    voucher = decode(payload, circuit_pb2.ReservationVoucher)
    if voucher.relay != relay.to_bytes() or voucher.peer != peer.to_bytes():
        raise RemoteProtocolError("voucher names another relay or peer")
    return voucher.expiration
