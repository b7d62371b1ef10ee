"""libp2p's Kademlia DHT wire (``/ipfs/kad/1.0.0``, go-libp2p-kad-dht), the peer-routing part,
sans-I/O: messages in and out, XOR distances, and which peers an answer names.

hivemind's DHT names nearest peers by peer id only; their addresses are found the libp2p way, by
asking peers for ``FIND_NODE(peer id)`` over this protocol (p2pd runs go-libp2p-kad-dht). We answer
``FIND_NODE`` and ``PING``, and ``GET_VALUE`` / ``GET_PROVIDERS`` with closer peers only (we keep no
kad records); ``PUT_VALUE`` and ``ADD_PROVIDER`` are refused. Messages are uvarint-delimited
protobufs (``framing.DelimitedDecoder`` reads them); distances are XOR of SHA-256 of the key bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import RemoteProtocolError, VolunteerError
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.pb.decode import parse
from ..net.varint import encode_uvarint
from .errors import HivemindUnsupported
from .limits import DEFAULT_KAD_LIMITS, KadLimits
from .pb.hm_kad_pb2 import Message

PROTOCOL = "/ipfs/kad/1.0.0"


@dataclass(frozen=True)
class KnownPeer:
    """A peer we can tell others about: its id, addresses, and whether we are connected to it."""

    peer: PeerID
    addrs: tuple[Multiaddr, ...]
    connected: bool = False


def kad_key(data: bytes) -> int:
    """A key's position in the kad keyspace: SHA-256 of its bytes (a peer id's multihash bytes)."""
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


def distance(a: bytes, b: bytes) -> int:
    """XOR distance between two keys (peer id bytes or raw keys)."""
    return kad_key(a) ^ kad_key(b)


def nearest(target: bytes, peers: Iterable[KnownPeer], count: int) -> list[KnownPeer]:
    """The ``count`` peers nearest ``target``, nearest first."""
    point = kad_key(target)
    return sorted(peers, key=lambda known: kad_key(known.peer.to_bytes()) ^ point)[:count]


def delimited(message: Message, limits: KadLimits = DEFAULT_KAD_LIMITS) -> bytes:
    """``message`` with its uvarint length prefix."""
    body = message.SerializeToString()
    if len(body) > limits.max_message:
        raise ValueError(f"kad message of {len(body)} bytes exceeds {limits.max_message}")
    return encode_uvarint(len(body)) + body


def find_node_request(target: PeerID) -> Message:
    """Ask for the peers nearest ``target`` (and its addresses, if the callee knows them)."""
    return Message(type=Message.FIND_NODE, key=target.to_bytes())


def ping_request() -> Message:
    """A kad PING (answered with a PING)."""
    return Message(type=Message.PING)


def parse_message(body: bytes) -> Message:
    """A kad message from its body; a bad protobuf raises RemoteProtocolError."""
    return parse(Message, body, "kad message")


def _peer_entry(known: KnownPeer, limits: KadLimits) -> Message.Peer:
    return Message.Peer(
        id=known.peer.to_bytes(),
        addrs=[addr.to_bytes() for addr in known.addrs[: limits.max_addrs]],
        connection=Message.CONNECTED if known.connected else Message.CAN_CONNECT,
    )


def answer(
    request: Message, known: Sequence[KnownPeer], requester: PeerID, limits: KadLimits = DEFAULT_KAD_LIMITS
) -> Message:
    """Our answer to ``request`` from ``requester``, given the peers we ``known`` (with addresses).
    Like go-libp2p-kad-dht, we never name the requester to itself; for FIND_NODE of a peer we know,
    that peer is always in the answer. Raises HivemindUnsupported for requests that write records."""
    kind = request.type
    if kind == Message.PING:
        return Message(type=Message.PING)
    if kind in (Message.PUT_VALUE, Message.ADD_PROVIDER):
        raise HivemindUnsupported(f"kad {Message.MessageType.Name(kind)} is not supported by volunteer")
    if kind not in (Message.FIND_NODE, Message.GET_VALUE, Message.GET_PROVIDERS):
        raise RemoteProtocolError(f"unknown kad message type {kind}")
    candidates = [p for p in known if p.peer != requester and p.addrs]
    closer = nearest(bytes(request.key), candidates, limits.max_closer)
    if kind == Message.FIND_NODE:
        exact = [p for p in candidates if p.peer.to_bytes() == request.key]
        if exact and exact[0] not in closer:
            closer = closer[: limits.max_closer - 1] + exact
    reply = Message(type=kind, key=request.key)
    reply.closerPeers.extend(_peer_entry(p, limits) for p in closer)
    return reply


def closer_peers(message: Message, limits: KadLimits = DEFAULT_KAD_LIMITS) -> list[KnownPeer]:
    """The peers an answer names, with their addresses; entries with a bad id or address are
    dropped (a peer's word on others is a hint, never trusted further)."""
    peers: list[KnownPeer] = []
    for entry in message.closerPeers[: limits.max_closer]:
        try:
            peer = PeerID.from_bytes(bytes(entry.id))
        except (VolunteerError, ValueError):
            continue
        addrs: list[Multiaddr] = []
        for raw in entry.addrs[: limits.max_addrs]:
            try:
                addrs.append(Multiaddr.from_bytes(bytes(raw)))
            except (VolunteerError, ValueError):
                continue
        peers.append(KnownPeer(peer, tuple(addrs), entry.connection == Message.CONNECTED))
    return peers


__all__ = [
    "KnownPeer",
    "PROTOCOL",
    "answer",
    "closer_peers",
    "delimited",
    "distance",
    "find_node_request",
    "kad_key",
    "nearest",
    "parse_message",
    "ping_request",
]
